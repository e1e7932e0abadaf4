"""`cic calibrate FILE --cascade M1,M2` and `--estimator auto` on a long score table: the printed gate is the
library's, the JSON reads back, and bad input is one line naming the option or value, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.stats.cascades import calibrate_cascade, choose_estimator

runner = CliRunner()
N = 1200


@pytest.fixture
def long_table(tmp_path: Path) -> tuple[Path, dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]]:
    """Two models × two estimators on the same questions (in a shuffled row order), one dataset, one criterion."""
    rng = np.random.default_rng(4)
    d = rng.random(N)
    arrays = {}
    frames = []
    for model, p, sd in (("small", 0.03 + 0.7 * d ** 2, 0.08), ("big", 0.02 + 0.25 * d, 0.05)):
        errors = (rng.random(N) < p).astype(int)
        for estimator, extra in (("se", 0.0), ("noisy", 0.3)):
            scores = p + sd * rng.normal(size=N) + extra * rng.normal(size=N)
            arrays[(model, estimator)] = (scores, errors)
            frames.append(pl.DataFrame({"model": model, "dataset": "demo", "estimator": estimator,
                                        "criterion": "match", "question_id": [f"q{i}" for i in range(N)],
                                        "score": scores, "error": errors}).sample(fraction=1.0, shuffle=True,
                                                                                  seed=len(frames)))
    path = tmp_path / "long.parquet"
    pl.concat(frames).write_parquet(path)
    return path, arrays


def test_a_cascade_from_a_long_table_is_the_librarys_joined_on_question_id(long_table, tmp_path: Path) -> None:
    path, arrays = long_table
    out = tmp_path / "cascade.json"
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.12", "--cascade", "small,big",
                                 "--estimator", "se", "--json", str(out)])
    assert result.exit_code == 0, result.output
    expected = calibrate_cascade([arrays[("small", "se")][0], arrays[("big", "se")][0]],
                                 [arrays[("small", "se")][1], arrays[("big", "se")][1]], alpha=0.12,
                                 models=("small", "big"))
    assert " ".join(result.output.split()).startswith(expected.summary().split(" (")[0])
    written = json.loads(out.read_text())
    assert written["kind"] == "cic.cascade_result" and written["n_accepted"] == expected.n_accepted
    assert written["thresholds"] == [t for t in expected.thresholds]


def test_estimator_auto_certifies_each_at_its_share_and_names_the_choice(long_table) -> None:
    path, arrays = long_table
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.12", "--estimator", "auto", "--model", "big"])
    assert result.exit_code == 0, result.output
    expected = choose_estimator({e: arrays[("big", e)] for e in ("noisy", "se")}, alpha=0.12)
    assert f"estimator {expected.estimator}:" in result.output and "delta / 2 = 0.025" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--cascade", "small"], "--cascade = 'small': two or more distinct models"),
    (["--cascade", "small,small"], "--cascade = 'small,small': two or more distinct models"),
    (["--cascade", "small,big"], "model 'small' has several estimators"),
    (["--cascade", "small,huge", "--estimator", "se"], "no rows for model 'huge'"),
    (["--cascade", "small,big", "--estimator", "auto"], "--cascade with --estimator auto"),
    (["--estimator", "auto"], "several models: name one with --model"),
    (["--estimator", "auto", "--model", "big", "--dataset", "other"], "--dataset = 'other': no rows"),
    (["--cascade", "small,big", "--estimator", "se", "--gate", "g.json"], "--gate do not apply with --cascade"),
    (["--estimator", "auto", "--model", "big", "--n-min", "50", "--table"], "--n-min, --table do not apply"),
])
def test_bad_system_options_are_one_line_exit_2(long_table, args: list[str], message: str) -> None:
    path, _ = long_table
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.12", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_the_json_result_may_not_overwrite_the_table_it_reads(long_table) -> None:
    path, _ = long_table
    before = path.read_bytes()
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.12", "--cascade", "small,big",
                                 "--estimator", "se", "--json", str(path)])
    assert result.exit_code == 2 and "--json" in result.output and path.read_bytes() == before, result.output


def test_a_csv_table_with_integer_question_ids_gives_the_same_cascade(long_table, tmp_path: Path) -> None:
    path, _ = long_table
    frame = pl.read_parquet(path).with_columns(pl.col("question_id").str.slice(1).cast(pl.Int64))
    csv = tmp_path / "long.csv"
    frame.write_csv(csv)
    args = ["--alpha", "0.12", "--cascade", "small,big", "--estimator", "se"]
    from_csv = runner.invoke(app, ["calibrate", str(csv), *args])
    from_parquet = runner.invoke(app, ["calibrate", str(path), *args])
    assert from_csv.exit_code == 0 and from_csv.output == from_parquet.output, from_csv.output
