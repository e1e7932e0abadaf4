"""The `cic` command line on precomputed Parquet and CSV tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import cic
from cic.cli import app
from tests.support.tables import make_table

runner = CliRunner()


@pytest.fixture
def table_files(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    scores, errors = make_table(np.random.default_rng(31), 1200)
    frame = pl.DataFrame({"uncertainty": scores, "wrong": errors, "right": 1 - errors})
    parquet, csv = tmp_path / "scores.parquet", tmp_path / "scores.csv"
    frame.write_parquet(parquet)
    frame.write_csv(csv)
    return parquet, csv, scores, errors


def test_calibrate_parquet_writes_result_and_gate(table_files, tmp_path: Path) -> None:
    parquet, _, scores, errors = table_files
    out, gate = tmp_path / "result.json", tmp_path / "gate.json"
    result = runner.invoke(app, ["calibrate", str(parquet), "--score-col", "uncertainty", "--error-col", "wrong",
                                 "--alpha", "0.2", "--json", str(out), "--gate", str(gate)])
    assert result.exit_code == 0, result.output
    expected = cic.calibrate(scores, errors, alpha=0.2)
    assert f"{expected.threshold:.6g}" in result.output
    assert cic.CalibrationResult.from_json(out.read_text()) == expected
    assert cic.Gate.from_json(gate.read_text()).threshold == expected.threshold


def test_calibrate_csv_with_correct_column_and_fixed_grid(table_files) -> None:
    _, csv, scores, errors = table_files
    result = runner.invoke(app, ["calibrate", str(csv), "--score-col", "uncertainty", "--correct-col", "right",
                                 "--alpha", "0.2", "--bound", "hoeffding", "--search", "bonferroni",
                                 "--grid", "0:1:20"])
    assert result.exit_code == 0, result.output
    expected = cic.calibrate(scores, errors, alpha=0.2, bound="hoeffding", search="bonferroni",
                             grid=cic.uniform_grid(0, 1, 20))
    assert (f"{expected.threshold:.6g}" if expected.feasible else "unattainable") in result.output


def test_calibrate_with_pilot_quantile_grid(table_files, tmp_path: Path) -> None:
    parquet, _, scores, errors = table_files
    pilot = tmp_path / "pilot.csv"
    pl.DataFrame({"uncertainty": np.random.default_rng(1).random(300)}).write_csv(pilot)
    result = runner.invoke(app, ["calibrate", str(parquet), "--score-col", "uncertainty", "--error-col", "wrong",
                                 "--alpha", "0.25", "--search", "bonferroni", "--pilot", str(pilot),
                                 "--grid-size", "10", "--table"])
    assert result.exit_code == 0, result.output
    assert "bonferroni" in result.output and "ucb" in result.output


def test_evaluate_prints_the_protocol_table_and_writes_it(table_files, tmp_path: Path) -> None:
    parquet, _, scores, errors = table_files
    out = tmp_path / "eval.csv"
    result = runner.invoke(app, ["evaluate", str(parquet), "--score-col", "uncertainty", "--error-col", "wrong",
                                 "--n-splits", "20", "--alphas", "0.1,0.2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = pl.read_csv(out)
    expected = cic.evaluate_splits(scores, errors, alphas=[0.1, 0.2], n_splits=20, search="fallback")
    assert written.height == 4 and set(written["search"]) == {"fallback"}  # the CLI's one default search
    np.testing.assert_allclose(written["coverage_mean"].to_numpy(), expected["coverage_mean"].to_numpy())
    assert "FDR" in result.output and "fails" in result.output
    assert f"evaluate {parquet.name}:" not in result.output  # quick: no progress lines (they start after 5 s)
    watched = runner.invoke(app, ["evaluate", str(parquet), "--score-col", "uncertainty", "--error-col", "wrong",
                                  "--n-splits", "20"], env={"CIC_PROGRESS_AFTER_S": "0"})
    assert watched.exit_code == 0 and watched.stdout.count("FDR") == result.stdout.count("FDR")
    # 20 splits x 5 alphas x 2 bounds x 1 search: heard before any work, then every 10%, on stderr
    assert f"evaluate {parquet.name}: 0/200 (0.0%)" in watched.stderr
    assert f"evaluate {parquet.name}: 200/200 (100.0%)" in watched.stderr and "evaluate" not in watched.stdout


def test_evaluate_shows_the_limits_beside_coverage_and_says_why_an_alpha_never_certifies(tmp_path: Path) -> None:
    """Each row's limit and ceiling read back from `cic.stats.limits`; an alpha no split certified gets its cause:
    the score (no threshold reaches it in-sample) or the labels."""
    from cic.stats.limits import ceiling, score_limit

    rng = np.random.default_rng(4)
    u = np.round(rng.random(300), 2)
    e = np.where(u <= 0.03, 1, (rng.random(300) < 0.4 * u).astype(int))
    data = tmp_path / "t.parquet"
    pl.DataFrame({"score": u, "error": e}).write_parquet(data)
    done = runner.invoke(app, ["evaluate", str(data), "--alphas", "0.02,0.1,0.3", "--n-splits", "10", "--bounds", "cp"],
                         env={"COLUMNS": "250"})
    assert done.exit_code == 0, done.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in done.output.splitlines() if line.startswith("│") and line.split("│")[1].strip()[:1].isdigit()}
    for alpha in (0.02, 0.1, 0.3):
        assert rows[f"{alpha:g}"][-2:] == [f"{score_limit(u, e, alpha):.3f}", f"{ceiling(e.mean(), alpha):.3f}"]
    flat = " ".join(done.output.split())
    assert score_limit(u, e, 0.02) == 0 and "alpha = 0.02: never certified; no threshold on this score" in flat
    assert "alpha = 0.3: never" not in flat
    small = tmp_path / "small.parquet"
    pl.DataFrame({"score": u[:40], "error": e[:40]}).write_parquet(small)
    few = runner.invoke(app, ["evaluate", str(small), "--alphas", "0.1", "--n-splits", "5"], env={"COLUMNS": "250"})
    assert score_limit(u[:40], e[:40], 0.1) > 0 and "alpha = 0.1: never certified; this score reaches it in-sample, " \
        "so too few labels: `cic calibrate --alpha 0.1` estimates about how many more" in " ".join(few.output.split())


@pytest.mark.parametrize("args,message", [
    (["calibrate", "missing.parquet", "--alpha", "0.1"], "does not exist"),
    (["calibrate", "{csv}", "--alpha", "0.1", "--score-col", "nope"], "column 'nope' not found"),
    (["calibrate", "{csv}", "--alpha", "1.5", "--score-col", "uncertainty", "--error-col", "wrong"],
     "alpha = 1.5"),
    (["calibrate", "{csv}", "--alpha", "0.1", "--score-col", "uncertainty", "--error-col", "uncertainty"],
     "errors must be 0/1"),
    (["calibrate", "{csv}", "--alpha", "0.1", "--score-col", "uncertainty", "--error-col", "wrong", "--bound", "x"],
     "bound = 'x'"),
    (["calibrate", "{csv}", "--alpha", "0.1", "--score-col", "uncertainty", "--error-col", "wrong", "--search",
      "bonferroni", "--grid", "0:1"], "expected LOW:HIGH:K"),
    (["evaluate", "{csv}", "--score-col", "uncertainty", "--error-col", "wrong", "--alphas", "0.1,x"],
     "--alphas = '0.1,x'"),
    (["evaluate", "{csv}", "--score-col", "uncertainty", "--error-col", "wrong", "--n-splits", "0"],
     "n_splits = 0"),
])
def test_bad_input_is_one_clear_line_and_status_2(table_files, args: list[str], message: str) -> None:
    _, csv, _, _ = table_files
    result = runner.invoke(app, [a.replace("{csv}", str(csv)) for a in args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_missing_value_in_a_column_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "gap.csv"
    path.write_text("score,error\n0.1,0\n,1\n0.3,0\n")
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.2"])
    assert result.exit_code == 2 and "missing value at row 1" in result.output


def test_installed_console_script_runs(table_files) -> None:
    parquet, _, _, _ = table_files
    exe = Path(sys.executable).with_name("cic")
    proc = subprocess.run([str(exe), "calibrate", str(parquet), "--score-col", "uncertainty", "--error-col",
                           "wrong", "--alpha", "0.2"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    assert "answer when score <=" in proc.stdout


def test_simulate_command() -> None:
    result = runner.invoke(app, ["simulate", "--trials", "200", "--n", "300", "--search", "fixed_sequence"])
    assert result.exit_code == 0, result.output
    assert "violation rate" in result.output
    json.dumps(result.output)  # plain text, no control characters that break logs


@pytest.mark.faults
@pytest.mark.parametrize("option", ["--json", "--gate"])
def test_output_into_a_missing_directory_or_onto_a_directory_fails_before_any_work(tmp_path: Path,
                                                                                    option: str) -> None:
    table = tmp_path / "t.csv"
    table.write_text("score,error\n" + "".join(f"{i / 100},{int(i % 9 == 0)}\n" for i in range(100)))
    for target, message in ((tmp_path / "missing" / "out.json", "does not exist"), (tmp_path, "is a directory")):
        result = CliRunner().invoke(app, ["calibrate", str(table), "--alpha", "0.3", option, str(target)])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
        assert "answer when" not in result.output  # refused before calibrating


def test_calibrate_per_group_prints_each_group_and_writes_their_gates(tmp_path: Path) -> None:
    from cic.stats.groups import calibrate_groups

    rng = np.random.default_rng(7)
    scores = rng.random(3000)
    groups = np.array(["web", "api", "tiny"])[np.r_[rng.integers(0, 2, 2990), np.full(10, 2)]]
    errors = (rng.random(3000) < 0.02 + 0.4 * scores + 0.06 * (groups == "api")).astype(int)
    path = tmp_path / "traffic.parquet"
    pl.DataFrame({"score": scores, "error": errors, "stream": groups}).write_parquet(path)
    gates = tmp_path / "gates.json"
    result = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.2", "--group", "stream", "--n-min", "150",
                                 "--gate", str(gates)])
    assert result.exit_code == 0, result.output
    expected = calibrate_groups(scores, errors, groups, alpha=0.2, n_min=150)
    text = " ".join(result.output.split())
    assert "3 groups" in text and "each group at 0.0167" in text and "alpha unattainable for this group" in text
    written = json.loads(gates.read_text())
    for row in expected.as_rows():
        assert written["groups"][row["group"]]["threshold"] == row["threshold"]
    assert written["groups"]["tiny"]["threshold"] is None and "every group's error rate" in written["guarantee"]
    missing = runner.invoke(app, ["calibrate", str(path), "--alpha", "0.2", "--group", "region"])
    assert missing.exit_code == 2 and "--group = 'region': no such column" in missing.output


def test_evaluate_per_group_prints_both_gates_for_each_group(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    labels = np.array(["web"] * 2000 + ["api"] * 1000)
    scores = rng.random(3000)
    errors = (rng.random(3000) < 0.02 + 0.4 * scores + 0.1 * (labels == "api")).astype(int)
    path, out = tmp_path / "t.csv", tmp_path / "groups.csv"
    pl.DataFrame({"score": scores, "error": errors, "stream": labels}).write_csv(path)
    result = runner.invoke(app, ["evaluate", str(path), "--group", "stream", "--alphas", "0.2", "--bounds", "cp",
                                 "--search", "fixed_sequence", "--n-splits", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "per group (stream)" in text and "pooled" in text and "per group" in text
    written = pl.read_csv(out)
    assert written.height == 4 and set(written["group"]) == {"web", "api"}


@pytest.mark.parametrize("command", ["calibrate", "evaluate"])
def test_a_repeated_question_id_is_refused_not_counted_twice(tmp_path: Path, command: str) -> None:
    """The same 200 questions written five times would inflate n five-fold and widen the threshold: refused in one
    line naming the id and its rows, as `--cascade` refuses it; nothing written."""
    scores, errors = make_table(np.random.default_rng(5), 200)
    ids = [f"q{i}" for i in range(200)]
    pl.DataFrame({"question_id": ids * 5, "score": np.tile(scores, 5), "error": np.tile(errors, 5)}) \
        .write_parquet(tmp_path / "five.parquet")
    out = tmp_path / "out.json"
    result = runner.invoke(app, [command, str(tmp_path / "five.parquet"), "--alpha" if command == "calibrate"
                                 else "--alphas", "0.2", *(["--json", str(out)] if command == "calibrate" else [])])
    assert result.exit_code == 2 and "question_id 'q0' appears more than once (rows 0 and 200;" in \
        " ".join(result.output.split()) and len(result.output.strip().splitlines()) <= 3, result.output
    assert not out.exists()


def test_calibrate_evaluate_and_report_read_json_lines_as_cic_ingest_does(table_files, tmp_path: Path) -> None:
    """A JSON-lines table (one object per line) is read like its CSV twin; a line that is not a JSON object is
    named by its number, exit 2."""
    _, csv, scores, errors = table_files
    jsonl = tmp_path / "scores.jsonl"
    pl.read_csv(csv).write_ndjson(jsonl)
    args = ["--score-col", "uncertainty", "--error-col", "wrong"]
    for source in (jsonl, csv):
        result = runner.invoke(app, ["calibrate", str(source), *args, "--alpha", "0.2"])
        assert result.exit_code == 0, result.output
        assert f"{cic.calibrate(scores, errors, alpha=0.2).threshold:.6g}" in result.output
    evaluated = runner.invoke(app, ["evaluate", str(jsonl), *args, "--alphas", "0.2", "--n-splits", "5"])
    assert evaluated.exit_code == 0, evaluated.output
    long = tmp_path / "long.ndjson"
    pl.read_csv(csv).rename({"uncertainty": "score", "wrong": "error"}).drop("right").with_columns(
        model=pl.lit("m"), dataset=pl.lit("d"), estimator=pl.lit("e"), criterion=pl.lit("c")).write_ndjson(long)
    reported = runner.invoke(app, ["report", str(long), "--out", str(tmp_path / "rep"), "--n-splits", "5"])
    assert reported.exit_code == 0, reported.output
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"score": 0.1, "error": 0}\n{"score": 0.2, "error": 1}\n{"score": 0.3, "error"\n')
    result = runner.invoke(app, ["calibrate", str(broken), "--alpha", "0.2"])
    assert result.exit_code == 2 and "line 3 is not a JSON object" in result.output, result.output


def test_one_group_of_a_long_table_is_certified_by_naming_it_and_an_unnamed_choice_is_one_line(
        tmp_path: Path) -> None:
    """A long table holding two estimators × two criteria: calibrate and evaluate ask which one (naming the values
    that differ), refuse a value the table lacks, and certify exactly the group named — the same result as that
    group alone in a plain table."""
    rng = np.random.default_rng(9)
    parts = []
    for estimator in ("se", "mp"):
        for criterion in ("em", "f1"):
            scores, errors = make_table(rng, 300)
            parts.append(pl.DataFrame({"model": "m", "dataset": "d", "estimator": estimator, "criterion": criterion,
                                       "question_id": [f"q{i}" for i in range(300)], "score": scores,
                                       "error": errors}))
    pl.concat(parts).write_parquet(tmp_path / "long.parquet")
    parts[3].select("score", "error").write_parquet(tmp_path / "alone.parquet")
    long = str(tmp_path / "long.parquet")
    asked = runner.invoke(app, ["calibrate", long, "--alpha", "0.2"])
    assert asked.exit_code == 2 and "holds 4 score tables: choose one with --estimator mp | se; --criterion em | f1" \
        in " ".join(asked.output.split()), asked.output
    lacking = runner.invoke(app, ["evaluate", long, "--estimator", "nope"])
    assert lacking.exit_code == 2 and "--estimator = 'nope': not in" in lacking.output
    chosen = runner.invoke(app, ["calibrate", long, "--alpha", "0.2", "--estimator", "mp", "--criterion", "f1"])
    alone = runner.invoke(app, ["calibrate", str(tmp_path / "alone.parquet"), "--alpha", "0.2"])
    assert chosen.exit_code == 0 and chosen.output == alone.output.replace("score 'score'", "score 'mp'"), \
        chosen.output  # the same result; the guarantee line names the score each read


def test_calibrate_says_its_guarantee_in_one_line_naming_the_score_and_whole_with_explain(table_files) -> None:
    parquet, _, _, _ = table_files
    args = ["calibrate", str(parquet), "--score-col", "uncertainty", "--error-col", "wrong", "--alpha", "0.2"]
    short = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert short.exit_code == 0, short.output
    lines = short.output.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("limits: certified ")  # why it answers what it does
    assert lines[2].startswith("guarantee: score 'uncertainty'; ")
    assert lines[2].endswith("(`--explain`: the whole statement)")
    whole = runner.invoke(app, [*args, "--explain"], env={"COLUMNS": "300"})
    assert whole.exit_code == 0 and "guarantee (score 'uncertainty'): " in whole.output
    assert len(whole.output) > len(short.output) + 200  # the search's whole statement


def test_calibrate_says_why_it_answers_what_it_does(tmp_path: Path) -> None:
    """The limits line: certified against the score's limit and any rule's ceiling (read back from
    `cic.stats.limits`); for an unattainable alpha, labels (about how many more) or the score."""
    from cic.stats.limits import ceiling, coverage_limits, score_limit

    rng = np.random.default_rng(4)
    u = np.round(rng.random(300), 2)
    e = (rng.random(300) < 0.4 * u).astype(int)
    data = tmp_path / "t.parquet"
    pl.DataFrame({"score": u, "error": e}).write_parquet(data)
    fine = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.2"])
    expected = cic.calibrate(u, e, alpha=0.2)
    assert fine.exit_code == 0 and (f"limits: certified {expected.n_accepted / 300:.3f} of questions; this score's "
                                    f"limit {score_limit(u, e, 0.2):.3f}") in " ".join(fine.output.split())
    assert f"any rule's ceiling {ceiling(e.mean(), 0.2):.3f}" in " ".join(fine.output.split())
    short = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.08"])
    needed = coverage_limits(u, e, alpha=0.08, certified=0.0, draws=100).labels_needed
    assert short.exit_code == 0 and "unattainable" in short.output and needed is not None and needed > 300
    assert f"about {needed - 300:,} more labelled answers" in " ".join(short.output.split())
    hopeless = tmp_path / "h.parquet"
    pl.DataFrame({"score": u, "error": np.where(u <= 0.05, 1, e)}).write_parquet(hopeless)
    stuck = runner.invoke(app, ["calibrate", str(hopeless), "--alpha", "0.05"])
    assert stuck.exit_code == 0 and "more labels will not help" in " ".join(stuck.output.split())


def test_calibrate_min_coverage_refuses_a_gate_that_cannot_promise_it(tmp_path: Path) -> None:
    """Two-sided: the summary says the coverage bound (read back from `cic.stats.coverage`); below --min-coverage
    the gate written abstains on everything and the limits line still shows what the refused threshold certified."""
    rng = np.random.default_rng(4)
    u = np.round(rng.random(600), 3)
    e = (rng.random(600) < 0.4 * u).astype(int)
    data = tmp_path / "t.parquet"
    pl.DataFrame({"score": u, "error": e}).write_parquet(data)
    expected = cic.calibrate(u, e, alpha=0.15)
    assert expected.coverage_lcb is not None and expected.coverage_lcb > 0.1
    kept = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.15", "--min-coverage", "0.1", "--explain"])
    flat = " ".join(kept.output.split())
    assert kept.exit_code == 0 and f"answers >= {expected.coverage_lcb:.3f} of questions with probability >= 0.95" \
        in flat, kept.output
    assert "Coverage: answers >=" in flat and "both hold with probability >= 0.9" in flat
    assert "labels missing, if at all, independently of the score" in flat.split("Coverage:")[1]  # its assumption
    refused = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.15", "--min-coverage", "0.9", "--gate",
                                  str(tmp_path / "g.json")])
    flat = " ".join(refused.output.split())
    assert refused.exit_code == 0 and "below min coverage 0.9: refused, abstain on everything" in flat, flat
    assert f"limits: certified {expected.n_accepted / 600:.3f} of questions" in flat
    assert cic.Gate.from_json((tmp_path / "g.json").read_text()).threshold is None
    for bad, says in ((["--min-coverage", "1.5"], "min_coverage = 1.5: must lie strictly between 0 and 1"),
                      (["--min-coverage", "0.2", "--group", "g"], "--min-coverage 0.2: applies to one table's gate")):
        wrong = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.15", *bad])
        assert wrong.exit_code == 2 and says in " ".join(wrong.output.split()), wrong.output


def test_calibrate_with_a_judge_and_people(tmp_path: Path) -> None:
    """--judge-col/--human-col certify as `cic.calibrate_judged` does (read back), say people's labels alone beside
    it and the label assumption, write a gate marked judge+people; half a pair or a clashing option exits 2."""
    rng = np.random.default_rng(5)
    u = rng.random(2000)
    wrong = rng.random(2000) < 0.25 * u
    judge = np.where(rng.random(2000) < 0.99, wrong, ~wrong)
    human = [bool(w) if i < 800 else None for i, w in enumerate(wrong)]
    data = tmp_path / "judged.parquet"
    pl.DataFrame({"score": u, "judge": judge, "human": human}).write_parquet(data)
    expected = cic.calibrate_judged(u, judge, np.array([np.nan if h is None else h for h in human], dtype=float),
                                    alpha=0.15)
    assert expected.feasible
    exe = Path(sys.executable).with_name("cic")
    proc = subprocess.run([str(exe), "calibrate", str(data), "--alpha", "0.15", "--judge-col", "judge", "--human-col",
                           "human", "--gate", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"}, cwd=tmp_path)
    flat = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stderr
    assert f"answer when score <= {expected.printed_threshold}" in flat and "prediction-powered" in flat
    assert "people a subset chosen at random" in flat and "people's labels alone (800)" in flat
    gate = cic.Gate.from_json((tmp_path / "g.json").read_text())
    assert gate.threshold == expected.threshold and gate.metadata["labels"] == "judge+people"
    for bad, says in ((["--judge-col", "judge"], "--judge-col needs --human-col"),
                      (["--judge-col", "judge", "--human-col", "human", "--group", "g"], "drop --group"),
                      (["--judge-col", "judge", "--human-col", "nope"], "--human-col = 'nope': no such column")):
        wrong_run = runner.invoke(app, ["calibrate", str(data), "--alpha", "0.15", *bad])
        assert wrong_run.exit_code == 2 and says in " ".join(wrong_run.output.split()), wrong_run.output
