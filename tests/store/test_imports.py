"""`cic import` refuses what would decide what serves (the store's own history: gate states, monitor state,
relabel events, the ingest journal) and times in the future; a refusal creates and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.store import Store
from tests.pipeline.test_gates import two_weeks
from tests.support.database import raw_sql

runner = CliRunner()


def _export(db: Path, table: str, out: Path) -> Path:
    done = runner.invoke(app, ["export", table, str(out), "--db", str(db)])
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.faults
@pytest.mark.parametrize("forgery", ["future live event", "unknown state", "plain copy"])
def test_gate_history_is_never_imported(tmp_path: Path, forgery: str) -> None:
    """A forged future-dated `live` event for a candidate with alerts, a state 'pwned', or an honest copy: all
    refused, the target store unchanged (what it exports stays what it served)."""
    db = tmp_path / "g.duckdb"
    live, candidate = two_weeks(db, shift=0.5, base=0.3)  # the candidate carries alerts
    events = pl.read_parquet(_export(db, "gate_events", tmp_path / "events.parquet"))
    if forgery != "plain copy":
        forged = events.head(1).with_columns(event_id=pl.lit("forged"), calibration_id=pl.lit(candidate),
                                             state=pl.lit("live" if forgery == "future live event" else "pwned"),
                                             created_at=pl.lit(datetime.now(UTC) + timedelta(days=365)))
        events = pl.concat([events, forged])
    path = tmp_path / "forged.parquet"
    events.write_parquet(path)
    with Store.open(db, read_only=True) as store:
        before = store.read("gate_events")
    result = runner.invoke(app, ["import", str(path), "--db", str(db), "--table", "gate_events"])
    assert result.exit_code == 2, result.output
    assert "table = 'gate_events': gate states" in result.output and "never imported" in result.output
    with Store.open(db, read_only=True) as store:
        assert store.read("gate_events").equals(before)


@pytest.mark.faults
def test_a_future_time_or_a_missing_file_is_refused_and_creates_no_store(tmp_path: Path) -> None:
    source = tmp_path / "g.duckdb"
    two_weeks(source)
    labels = pl.read_parquet(_export(source, "labels", tmp_path / "labels.parquet"))
    ahead = tmp_path / "ahead.parquet"
    labels.with_columns(created_at=pl.lit(datetime(2099, 1, 1, tzinfo=UTC))).write_parquet(ahead)
    target = tmp_path / "new.duckdb"
    future = runner.invoke(app, ["import", str(ahead), "--db", str(target), "--table", "labels"])
    assert future.exit_code == 2 and "labels.created_at = 2099-01-01 00:00:00+00:00 is in the future" in future.output
    missing = runner.invoke(app, ["import", str(tmp_path / "nope.parquet"), "--db", str(target), "--table", "labels"])
    assert missing.exit_code == 2 and "no such file" in missing.output
    assert not target.exists()  # neither refusal created a store
    fine = runner.invoke(app, ["import", str(tmp_path / "labels.parquet"), "--db", str(target)])
    assert fine.exit_code == 0 and f"{labels.height} labels rows imported" in fine.output


@pytest.mark.faults
def test_an_import_that_fills_a_stored_null_score_is_a_change_refused_without_replace(tmp_path: Path) -> None:
    """A stored null (a score an estimator could not compute: routine) turned into 0.5 by an import changes the
    row: refused without --replace, the store unchanged (null compares as a value, not as unknown)."""
    db = tmp_path / "g.duckdb"
    two_weeks(db)
    scores = pl.read_parquet(_export(db, "scores", tmp_path / "scores.parquet"))
    first = scores.row(0, named=True)
    raw_sql(db, "UPDATE scores SET value = NULL WHERE run_key = ? AND question_id = ? AND estimator = ?",
            params=[first["run_key"], first["question_id"], first["estimator"]])
    with Store.open(db, read_only=True) as store:
        before = store.read("scores")
    filled = scores.head(1).with_columns(value=pl.lit(0.5))
    path = tmp_path / "filled.parquet"
    filled.write_parquet(path)
    result = runner.invoke(app, ["import", str(path), "--db", str(db), "--table", "scores"])
    assert result.exit_code == 2, result.output
    assert "--replace" in result.output
    with Store.open(db, read_only=True) as store:
        assert store.read("scores").equals(before)
