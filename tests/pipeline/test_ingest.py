"""Production records in: Parquet/CSV/JSONL round trips, idempotence, labels that arrive later, gold answers
judged by a criterion, and bad records named without anything being written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.errors import UserError
from cic.pipeline.production.ingest import IngestOptions, ingest_file, run_key_of
from cic.pipeline.production.recalibration import labelled_pairs
from cic.pipeline.run.stored_calibration import groups_of_run
from cic.store import Store

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def records(n: int = 6, *, correct: list[object] | None = None) -> pl.DataFrame:
    return pl.DataFrame({
        "model": "qwen", "stream": "support-bot", "question_id": [f"r{i}" for i in range(n)],
        "question": [f"question {i}?" for i in range(n)], "answer": [f"answer {i}" for i in range(n)],
        # production order is not label order: the last record was seen first
        "timestamp": [T0 + timedelta(minutes=(n - i) % n) for i in range(n)],
        "score:semantic_entropy": [0.1 * i for i in range(n)], "score:predictive_entropy": [1.0 + i for i in range(n)],
        "correct": correct if correct is not None else [i % 3 != 0 for i in range(n)]})


def write(frame: pl.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv" and "timestamp" in frame.columns:
        frame.with_columns(pl.col("timestamp").dt.to_string("%Y-%m-%dT%H:%M:%SZ")).write_csv(path)
    elif path.suffix == ".csv":
        frame.write_csv(path)
    elif path.suffix == ".jsonl":
        frame.write_ndjson(path)
    else:
        frame.write_parquet(path)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_records_round_trip_into_the_store_and_twice_changes_nothing(tmp_path: Path, suffix: str) -> None:
    source = write(records(), tmp_path / f"traffic{suffix}")
    with Store.open(tmp_path / "s.duckdb") as store:
        stats = ingest_file(store, source)
        first = {t: store.read(t) for t in ("runs", "questions", "generations", "scores", "labels", "observations")}
        again = ingest_file(store, source)
        second = {t: store.read(t) for t in first}
        key = run_key_of("qwen", "support-bot")
        group = [g for g in groups_of_run(store, store.read("runs").row(0, named=True))
                 if g.estimator == "semantic_entropy"][0]
        pairs = labelled_pairs(store, group)
    assert stats.records == again.records == 6 and stats.labels == 6 and stats.unlabelled == 0
    assert all(first[t].equals(second[t]) for t in first)  # created_at included: nothing rewritten
    run = first["runs"].row(0, named=True)
    assert (run["run_key"], run["model"], run["dataset"], run["split"]) == (key, "qwen", "support-bot", "production")
    assert first["scores"].height == 12 and set(first["scores"]["estimator"]) == {"semantic_entropy",
                                                                                   "predictive_entropy"}
    assert first["generations"].filter(question_id="r2")["text"][0] == "answer 2"
    assert first["labels"].filter(question_id="r3")["aligned"][0] is False
    assert first["labels"]["criterion"].unique().to_list() == ["human"]
    assert first["observations"].filter(question_id="r0")["observed_at"][0] == T0
    # recalibration windows follow when production saw a question, not when it was stored
    assert pairs["question_id"].to_list() == ["r0", "r5", "r4", "r3", "r2", "r1"]


def test_unlabelled_records_are_kept_and_labelled_later_by_a_labels_only_file(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        stats = ingest_file(store, write(records(correct=[None] * 6), tmp_path / "week.parquet"))
        assert stats.records == 6 and stats.labels == 0 and stats.unlabelled == 6 and store.count("labels") == 0
        labels = pl.DataFrame({"model": "qwen", "stream": "support-bot", "question_id": ["r1", "r4"],
                               "correct": ["yes", "0"]})
        later = ingest_file(store, write(labels, tmp_path / "labels.csv"))
        stored = store.read("labels")
        assert later.records == 0 and later.labels == 2
        assert dict(stored.select("question_id", "aligned").iter_rows()) == {"r1": True, "r4": False}
        assert store.count("generations") == 6  # labels alone touch no record


def test_gold_answers_are_labelled_with_a_named_criterion(tmp_path: Path) -> None:
    frame = records(3).drop("correct").with_columns(gold=pl.Series(["Answer 0", "something else", "answer  2."]))
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(frame, tmp_path / "gold.parquet"), IngestOptions(criterion="exact_match"))
        stored = store.read("labels")
        assert stored["criterion"].unique().to_list() == ["exact_match"]
        assert dict(stored.select("question_id", "aligned").iter_rows()) == {"r0": True, "r1": False, "r2": True}
        assert store.read("questions").filter(question_id="r1")["answer"][0] == "something else"


BAD = [
    (lambda f: f.drop("question_id"), "lacks column(s) question_id"),
    (lambda f: f.with_columns(pl.Series("correct", ["true", "maybe", "false", "1", "0", "1"])),
     "record 2 (question_id 'r1'): correct = 'maybe'"),
    (lambda f: f.with_columns(pl.Series("score:semantic_entropy", [0.1, 0.2, 0.3, float("nan"), 0.5, 0.6])),
     "record 4 (question_id 'r3'): score:semantic_entropy = nan"),
    (lambda f: f.with_columns(pl.Series("timestamp", ["2026-11-01T09:00:00Z"] * 4 + ["last tuesday", "x"])),
     "record 5 (question_id 'r4'): timestamp = 'last tuesday'"),
    (lambda f: f.with_columns(pl.Series("question_id", ["r0", "r1", "r2", "r1", "r4", "r5"])),
     "records 2, 4 repeat model 'qwen', stream 'support-bot', question_id 'r1'"),
    (lambda f: f.with_columns(pl.Series("stream", ["s", "s", "", "s", "s", "s"])), "record 3 (question_id 'r2'): "
                                                                                    "stream is empty"),
    (lambda f: f.with_columns(extra=pl.lit(1)), "unknown column(s) 'extra'"),
    (lambda f: f.drop("score:semantic_entropy", "score:predictive_entropy"), "records need score:<estimator>"),
    (lambda f: f.with_columns(gold=pl.lit("x")), "has a gold column: name the criterion"),
]


@pytest.mark.faults
@pytest.mark.parametrize(("spoil", "message"), BAD)
def test_a_bad_record_is_named_and_nothing_of_the_file_is_written(tmp_path: Path, spoil: object,
                                                                  message: str) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(records(), tmp_path / "good.parquet"))
        before = store.counts()
        with pytest.raises(UserError) as caught:
            frame = spoil(records().with_columns(pl.col("timestamp").cast(pl.String)))  # type: ignore[operator]
            ingest_file(store, write(frame, tmp_path / "bad.parquet"))
        assert message in str(caught.value)
        assert store.counts() == before


@pytest.mark.faults
def test_labels_for_records_never_ingested_are_refused(tmp_path: Path) -> None:
    labels = pl.DataFrame({"model": "qwen", "stream": "support-bot", "question_id": ["r1", "nope"],
                           "correct": [True, False]})
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(records(), tmp_path / "good.parquet"))
        before = store.read("labels")
        with pytest.raises(UserError, match="record 2 \\(question_id 'nope'\\): no ingested record"):
            ingest_file(store, write(labels, tmp_path / "labels.parquet"))
        assert store.read("labels").equals(before)


@pytest.mark.faults
def test_cic_ingest_reports_and_refuses_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ok = CliRunner().invoke(app, ["ingest", str(write(records(), tmp_path / "t.parquet")), "--db", str(db)])
    assert ok.exit_code == 0, ok.output
    assert "6 record(s) stored, 6 labelled (qwen/support-bot)" in " ".join(ok.output.split())
    # `score:semantic_entropy` is not what `cic ask` computes: said at ingest, with the spelling it can
    said = " ".join(ok.output.split())
    assert "warning: score 'semantic_entropy': `cic ask` computes this estimator as " \
           "'semantic_entropy[embedding:0.9]'" in said and "score 'predictive_entropy'" not in said
    again = CliRunner().invoke(app, ["ingest", str(tmp_path / "t.parquet"), "--db", str(db)])
    assert again.exit_code == 0 and "6 record(s): 0 new, 6 already stored (unchanged)" in " ".join(again.output.split())
    text = tmp_path / "t.txt"
    text.write_text("hello")
    bad = CliRunner().invoke(app, ["ingest", str(text), "--db", str(db)])
    assert bad.exit_code == 2 and "unsupported type '.txt'" in bad.output
    missing = CliRunner().invoke(app, ["ingest", str(tmp_path / "t.parquet"), "--db", str(tmp_path / "no/s.duckdb")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_group_column_stores_each_group_as_its_own_stream_and_a_record_keeps_its_group(tmp_path: Path) -> None:
    """`--group tier`: records go to streams '<stream>/<tier>'; the same record under another group (in the store
    or in one file), a group with '/', a missing group column and a group column with another role are refused
    naming record and value, and nothing of the refused file is stored."""
    frame = records().with_columns(tier=pl.Series(["gold", "free"] * 3))
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        stats = ingest_file(store, write(frame, tmp_path / "a.parquet"), IngestOptions(group="tier"))
        runs = store.read("runs")
        assert sorted(runs["dataset"]) == ["support-bot/free", "support-bot/gold"]
        assert stats.records == 6 and sorted(r["stream"] for r in stats.runs) == sorted(runs["dataset"])
        tier = IngestOptions(group="tier")
        assert ingest_file(store, write(frame, tmp_path / "a.parquet"), tier).records == 6  # idempotent
        labels = frame.select("model", "stream", "question_id", "tier", "correct")
        assert ingest_file(store, write(labels, tmp_path / "l.parquet"), IngestOptions(group="tier")).labels == 6
        before = {t: store.read(t) for t in ("runs", "questions", "observations", "labels")}
        moved = frame.with_columns(tier=pl.Series(["free", "free"] * 3))  # r0 was gold
        with pytest.raises(UserError, match="record 1 \\(question_id 'r0'\\): model 'qwen' has this question "
                                             "stored in stream 'support-bot/gold', not 'support-bot/free'"):
            ingest_file(store, write(moved, tmp_path / "m.parquet"), IngestOptions(group="tier"))
        with pytest.raises(UserError, match="stored in stream 'support-bot/gold', not 'support-bot'"):
            ingest_file(store, write(records(), tmp_path / "plain.parquet"))  # ungrouped: still the same record
        twice = pl.concat([frame.head(1), frame.head(1).with_columns(tier=pl.lit("free"))])
        with pytest.raises(UserError, match="records 1, 2 put question_id 'r0' of model 'qwen', stream "
                                             "'support-bot' in two groups \\('support-bot/free' and "
                                             "'support-bot/gold'\\)"):
            ingest_file(store, write(twice, tmp_path / "t.parquet"), IngestOptions(group="tier"))
        with pytest.raises(UserError, match="tier = 'a/b': a group may not contain '/'"):
            ingest_file(store, write(frame.with_columns(tier=pl.lit("a/b")), tmp_path / "s.parquet"), tier)
        with pytest.raises(UserError, match="record 1 \\(question_id 'r0'\\): tier is empty"):
            ingest_file(store, write(frame.with_columns(tier=pl.lit(" ")), tmp_path / "e.parquet"), tier)
        with pytest.raises(UserError, match="group = 'segment': .* has no such column"):
            ingest_file(store, write(frame, tmp_path / "a.parquet"), IngestOptions(group="segment"))
        with pytest.raises(UserError, match="group = 'stream': that column already has a role"):
            ingest_file(store, write(frame, tmp_path / "a.parquet"), IngestOptions(group="stream"))
        slash = records().with_columns(stream=pl.lit("support-bot/gold"), question_id=pl.lit("x") + pl.col(
            "question_id"))  # an ungrouped stream named like a group of another
        with pytest.raises(UserError, match="stream 'support-bot/gold' of model 'qwen' is stored as a group of "
                                             "stream 'support-bot', and this file would make it a stream of its own"):
            ingest_file(store, write(slash, tmp_path / "slash.parquet"))
        with pytest.raises(UserError, match="unknown column\\(s\\) 'tier'"):
            ingest_file(store, write(frame, tmp_path / "a.parquet"))  # the column is not silently dropped
        after = {t: store.read(t) for t in before}
    assert all(before[t].equals(after[t]) for t in before)
    result = CliRunner().invoke(app, ["ingest", str(tmp_path / "a.parquet"), "--db", str(db), "--group", "nope"])
    assert result.exit_code == 2 and "group = 'nope'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("text", ["nan", "NaN", "NA"])
def test_a_csv_score_written_as_nan_is_refused_as_the_readme_says(tmp_path: Path, text: str) -> None:
    """Only an empty cell means "the estimator gave no score"; `nan` (pandas' NaN) or `NA` in a CSV is a value, and
    a score must be a finite number: refused naming the record and the value, nothing stored."""
    path = write(records(), tmp_path / "t.csv")
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[2].split(",")
    cells[header.index("score:semantic_entropy")] = text
    path.write_text("\n".join([*lines[:2], ",".join(cells), *lines[3:]]) + "\n")
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        with pytest.raises(UserError, match=f"record 2 .*score:semantic_entropy = '{text}': expected a finite number"):
            ingest_file(store, path)
        assert store.read("scores").height == 0


def test_a_judge_on_every_record_and_people_on_a_few_certify_together_from_the_store(tmp_path: Path) -> None:
    """`correct:judge` on every record and `correct:human` on a few are stored as two criteria; the installed
    `cic calibrate STORE --judge-col judge --human-col human` certifies as `cic.calibrate_judged` does on them
    (read back); a labeller named like a criterion, or twice, is refused in one line."""
    import os
    import subprocess
    import sys

    import numpy as np

    import cic

    n = 2000
    rng = np.random.default_rng(3)
    score = rng.random(n)
    wrong = rng.random(n) < 0.3 * score
    judge = np.where(rng.random(n) < 0.98, wrong, ~wrong)
    human = [None if i % 4 else not bool(w) for i, w in enumerate(wrong)]  # people labelled every fourth record
    frame = records(n).drop("correct").with_columns(pl.Series("score:semantic_entropy", score),
                                                    pl.Series("correct:judge", ~judge),
                                                    pl.Series("correct: human", human))
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        stats = ingest_file(store, write(frame, tmp_path / "traffic.parquet"))
        stored = store.read("labels").group_by("criterion").len()
    assert stats.records == n and dict(stored.iter_rows()) == {"judge": n, "human": n // 4}
    people = np.array([np.nan if h is None else not h for h in human], dtype=float)
    expected = cic.calibrate_judged(score, judge, people, alpha=0.2, ids=[f"r{i}" for i in range(n)])
    assert expected.feasible and expected.n_human == n // 4
    proc = subprocess.run([str(Path(sys.executable).with_name("cic")), "calibrate", str(db), "--alpha", "0.2",
                           "--model", "qwen", "--dataset", "support-bot", "--estimator", "semantic_entropy",
                           "--judge-col", "judge", "--human-col", "human"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"answer when score <= {expected.printed_threshold}" in " ".join(proc.stdout.split())
    for bad, says in (({"correct:similarity[0.6]": [True] * 6}, r"'similarity\[0.6\]' is a criterion's name"),
                      ({"correct:judge": [True] * 6, "correct: judge": [True] * 6}, "two columns name labeller"),
                      ({"correct:human": [True] * 6}, "label under one name"),
                      ({"correct:judge+human": [True] * 6}, r"'\+' joins a judge's criterion and the people's")):
        spoiled = records().with_columns(**{k: pl.Series(v) for k, v in bad.items()})
        with Store.open(tmp_path / "bad.duckdb") as store, pytest.raises(UserError, match=says):
            ingest_file(store, write(spoiled, tmp_path / "bad.parquet"))
