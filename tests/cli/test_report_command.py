"""`cic report` and `cic validity`: files in, report directory out, artifacts in a real local MLflow store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from tests.support.tables import make_table

runner = CliRunner()
FAST = ["--n-splits", "6", "--fractions", "", "--baselines", "", "--no-figures"]


def _scores_file(path: Path, seed: int, **extra: str) -> Path:
    scores, errors = make_table(np.random.default_rng(seed), 500, decimals=3, base=0.02)
    frame = pl.DataFrame({"question_id": [f"q{i}" for i in range(500)], "uncertainty": scores, "wrong": errors})
    frame = frame.with_columns(**{k: pl.lit(v) for k, v in extra.items()})
    frame.write_parquet(path) if path.suffix == ".parquet" else frame.write_csv(path)
    return path


def test_report_on_two_files_with_per_file_labels(tmp_path: Path) -> None:
    a = _scores_file(tmp_path / "a.parquet", 1)
    b = _scores_file(tmp_path / "b.csv", 2)
    out = tmp_path / "rep"
    result = runner.invoke(app, ["report", str(a), str(b), "--out", str(out), "--model", "qwen", "--model", "llama",
                                 "--dataset", "csqa", "--score-col", "uncertainty", "--error-col", "wrong", *FAST])
    assert result.exit_code == 0, result.output
    results = pl.read_csv(out / "tables" / "results.csv")
    assert results.select("model", "dataset", "estimator", "criterion").unique(maintain_order=True).rows() == [
        ("qwen", "csqa", "uncertainty", "wrong"), ("llama", "csqa", "uncertainty", "wrong")]
    fdr = (out / "tables" / "fdr.md").read_text()
    assert "| qwen | UCB-HFD |" in fdr and "| llama | UCB-HFD |" in fdr
    assert not (out / "figures").exists()


def test_report_reads_group_columns_from_a_long_file(tmp_path: Path) -> None:
    path = _scores_file(tmp_path / "long.csv", 3, model="m", dataset="d", estimator="se", criterion="match")
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "r"), "--score-col", "uncertainty",
                                 "--error-col", "wrong", "--alphas", "0.2", "--bounds", "cp", *FAST])
    assert result.exit_code == 0, result.output
    assert pl.read_csv(tmp_path / "r" / "tables" / "results.csv").height == 1


@pytest.mark.parametrize("args,message", [
    (["--model", "x"], "already has a column 'model'"),
    (["--model", "a", "--model", "b", "--model", "c"], "--model was given 3 times for 1 files"),
    (["--alphas", "0.1,zz"], "--alphas = '0.1,zz'"),
    (["--baselines", "oracle"], "baseline = 'oracle'"),
    (["--group-by", "stream"], "--group-by = 'stream': the report groups by 'dataset'"),
    (["--group-by", "dataset"], "no model has two or more datasets in this table"),
])
def test_report_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    path = _scores_file(tmp_path / "long.csv", 3, model="m", dataset="d")
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "r"), "--score-col", "uncertainty",
                                 "--error-col", "wrong", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_report_without_labels_names_the_missing_column(tmp_path: Path) -> None:
    path = _scores_file(tmp_path / "plain.csv", 4)
    result = runner.invoke(app, ["report", str(path), "--score-col", "uncertainty", "--error-col", "wrong"])
    assert result.exit_code == 2
    assert "has no column 'model': label it with --model NAME" in result.output


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str]]:
    """A real local MLflow tracking store (SQLite) with its artifact root in tmp, and one run in it."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.create_experiment("reports", artifact_location=(root / "artifacts").as_uri())
        yield client, client.create_run(experiment).info.run_id


@pytest.mark.slow
def test_report_is_logged_as_mlflow_artifacts(tmp_path: Path, mlflow_store) -> None:
    client, run_id = mlflow_store
    path = _scores_file(tmp_path / "long.csv", 5, model="m", dataset="d")
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "rep"), "--score-col", "uncertainty",
                                 "--error-col", "wrong", "--mlflow-run-id", run_id, *FAST])
    assert result.exit_code == 0, result.output
    top = {f.path for f in client.list_artifacts(run_id, "report")}
    assert {"report/README.md", "report/tables"} <= top
    tables = {f.path for f in client.list_artifacts(run_id, "report/tables")}
    assert "report/tables/fdr.tex" in tables
    local = Path(client.download_artifacts(run_id, "report/tables/fdr.md", str(tmp_path / "dl")))
    assert local.read_text() == (tmp_path / "rep" / "tables" / "fdr.md").read_text()


@pytest.mark.slow
def test_unknown_mlflow_run_fails_before_any_work(tmp_path: Path, mlflow_store) -> None:
    path = _scores_file(tmp_path / "long.csv", 5, model="m", dataset="d")
    out = tmp_path / "never"
    result = runner.invoke(app, ["report", str(path), "--out", str(out), "--score-col", "uncertainty",
                                 "--error-col", "wrong", "--mlflow-run-id", "0123456789abcdef", *FAST])
    assert result.exit_code == 2
    assert "--mlflow-run-id = '0123456789abcdef'" in result.output
    assert not out.exists()


def test_validity_command_writes_the_study(tmp_path: Path) -> None:
    out = tmp_path / "val"
    result = runner.invoke(app, ["validity", "--out", str(out), "--trials", "100", "--ns", "150", "--alphas", "0.1",
                                 "--searches", "paper,fixed_sequence", "--bounds", "cp", "--no-figure"])
    assert result.exit_code == 0, result.output
    table = pl.read_csv(out / "validity.csv")
    assert table.height == 2 * 2  # scenarios x searches
    assert "violation rate" in result.output and not (out / "validity.png").exists()
    bad = runner.invoke(app, ["validity", "--out", str(out), "--ns", "10,x"])
    assert bad.exit_code == 2 and "--ns = '10,x'" in bad.output


def test_report_per_dataset_table_puts_per_dataset_gates_beside_the_pooled_gate(tmp_path: Path) -> None:
    """`--group-by dataset` on two files of one model, one far worse: per_group.md/.csv hold, per dataset and α,
    the per-dataset gates (δ / G) and the pooled gate; the pooled gate's share of splits above α on the worse
    dataset is at least the per-dataset gate's (it certifies the mix, not the dataset)."""
    rng = np.random.default_rng(0)
    paths = []
    for name, excess in (("easy", 0.0), ("hard", 0.2)):
        u = rng.random(1500)
        wrong = (rng.random(1500) < 0.05 + 0.5 * u + excess).astype(int)
        paths.append(tmp_path / f"{name}.parquet")
        pl.DataFrame({"uncertainty": u, "wrong": wrong}).write_parquet(paths[-1])
    out = tmp_path / "r"
    result = runner.invoke(app, ["report", *map(str, paths), "--out", str(out), "--model", "m", "--dataset", "easy",
                                 "--dataset", "hard", "--estimator", "se", "--criterion", "c", "--score-col",
                                 "uncertainty", "--error-col", "wrong", "--alphas", "0.3", "--search",
                                 "fixed_sequence", "--group-by", "dataset", *FAST])
    assert result.exit_code == 0, result.output
    table = pl.read_csv(out / "tables" / "per_group.csv")
    assert sorted(zip(table["dataset"], table["gate"], strict=True)) == [
        ("easy", "per_group"), ("easy", "pooled"), ("hard", "per_group"), ("hard", "pooled")]
    hard = {r["gate"]: r for r in table.filter(pl.col("dataset") == "hard").iter_rows(named=True)}
    assert hard["pooled"]["fdr_above_alpha"] >= (hard["per_group"]["fdr_above_alpha"] or 0.0)
    assert hard["pooled"]["fdr_above_alpha"] > 0.5  # the mix's gate accepts hard answers above α
    assert "per dataset (δ/G)" in (out / "tables" / "per_group.md").read_text()
    assert "tables/per_group.md" in (out / "README.md").read_text()
