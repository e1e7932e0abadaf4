"""The `cic datasets`, `cic export` and `cic import` commands."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.store import Store

runner = CliRunner()


def test_datasets_lists_the_registry() -> None:
    result = runner.invoke(app, ["datasets"])
    assert result.exit_code == 0, result.output
    for text in ("commonsense_qa", "trivia_qa", "mc-letter-v1", "short-answer-v1", "tau/commonsense_qa"):
        assert text in result.output


def test_datasets_loads_stores_and_exports_questions(tmp_path: Path) -> None:
    db = tmp_path / "cic.duckdb"
    args = ["datasets", "commonsense_qa", "--limit", "12", "--seed", "3", "--db", str(db), "--prompt"]
    for _ in range(2):  # idempotent
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert "12 questions stored" in result.output and "Answer:" in result.output
    with Store.open(db, read_only=True) as store:
        assert store.count("questions") == 12
    out = tmp_path / "q.parquet"
    result = runner.invoke(app, ["export", "questions", str(out), "--db", str(db), "--where", "dataset=commonsense_qa"])
    assert result.exit_code == 0, result.output
    assert "12 questions rows written" in result.output
    assert pl.read_parquet(out).height == 12
    other = tmp_path / "other.duckdb"
    result = runner.invoke(app, ["import", str(out), "--db", str(other)])
    assert result.exit_code == 0, result.output
    with Store.open(other, read_only=True) as store, Store.open(db, read_only=True) as first:
        assert store.read("questions").equals(first.read("questions"))


def test_export_filters_are_typed(tmp_path: Path) -> None:
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store.upsert("generations", pl.DataFrame({
            "run_key": "r", "question_id": ["a", "a", "b"], "sample_index": [0, 1, 0], "text": "x", "n_tokens": 1,
            "logprob_sum": -1.0, "logprob_mean": -1.0, "is_greedy": [True, False, True], "option_probs": None,
            "flags": [[], ["empty"], []]}))
    out = tmp_path / "greedy.parquet"
    result = runner.invoke(app, ["export", "generations", str(out), "--db", str(db), "--where", "sample_index=0"])
    assert result.exit_code == 0, result.output
    assert pl.read_parquet(out)["question_id"].to_list() == ["a", "b"]
    result = runner.invoke(app, ["export", "generations", str(out), "--db", str(db), "--where", "sample_index=x"])
    assert result.exit_code == 2 and "'x' is not a valid Int32" in result.output


def test_store_and_dataset_errors_are_one_clear_line(tmp_path: Path) -> None:
    text_file = tmp_path / "notes.duckdb"
    text_file.write_text("not a database\n")
    result = runner.invoke(app, ["export", "scores", str(tmp_path / "s.parquet"), "--db", str(text_file)])
    assert result.exit_code == 2 and "is not a DuckDB database" in result.output and "Traceback" not in result.output
    assert text_file.read_text() == "not a database\n"
    db = tmp_path / "fresh.duckdb"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "a", "question": "q?"}\n')
    result = runner.invoke(app, ["datasets", "trivia_qa", "--source", str(bad), "--db", str(db)])
    assert result.exit_code == 2 and "field 'answer' is missing or empty" in result.output
    assert not db.exists()  # nothing written
    result = runner.invoke(app, ["export", "nonsense", str(tmp_path / "x.parquet"), "--db", str(db)])
    assert result.exit_code == 2 and "table = 'nonsense': unknown" in result.output


@pytest.mark.slow
def test_a_reader_waits_for_the_writer_that_holds_the_store_and_says_so(tmp_path: Path) -> None:
    """`cic export` started while another process writes the store waits (one line) and then reads it."""
    import os
    import subprocess
    import sys
    import time

    from tests.support.pipeline_data import store_run

    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store_run(store, n=50)
    hold = ("import sys, time\nfrom cic.store import Store\nwith Store.open(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(4)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    writer = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert writer.stdout.readline().strip() == "held"
        started = time.monotonic()
        cic = str(Path(sys.executable).with_name("cic"))
        reader = subprocess.run([cic, "export", "labels", "labels.parquet", "--db", str(db)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        waited = time.monotonic() - started
    finally:
        writer.wait(timeout=30)
    assert reader.returncode == 0, reader.stdout + reader.stderr
    assert "is held by another process (a writer between batches); waiting up to 120 s" in reader.stderr
    assert reader.stderr.count("waiting up to") == 1 and waited > 1
    assert "50 labels rows written" in reader.stdout
