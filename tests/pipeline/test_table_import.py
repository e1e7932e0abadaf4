"""`cic import` keeps stored facts append-only: a table that would change stored rows is refused (one line, exit 2,
nothing written) unless --replace, and then each change is an event and the gates holding it are flagged."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.pipeline.gates.lifecycle import gates
from cic.store import Store
from tests.pipeline.test_gates import two_weeks

pytestmark = pytest.mark.faults
runner = CliRunner()


def _exported(db: Path, table: str, out: Path) -> pl.DataFrame:
    done = runner.invoke(app, ["export", table, str(out), "--db", str(db)])
    assert done.exit_code == 0, done.output
    return pl.read_parquet(out)


@pytest.mark.parametrize("table", ["labels", "scores"])
def test_an_import_that_changes_stored_rows_is_refused_unless_replaced_then_recorded_and_flagged(
        tmp_path: Path, table: str) -> None:
    db = tmp_path / "g.duckdb"
    live, _ = two_weeks(db)
    rows = _exported(db, table, tmp_path / "rows.parquet")
    same = runner.invoke(app, ["import", str(tmp_path / "rows.parquet"), "--db", str(db)])
    assert same.exit_code == 0, same.output  # the same rows again: idempotent, nothing recorded
    column = "aligned" if table == "labels" else "value"
    edited = rows.sort("question_id").with_columns(
        pl.when(pl.int_range(pl.len()) < 10).then(~pl.col("aligned") if table == "labels" else pl.col("value") + 1)
        .otherwise(pl.col(column)).alias(column))
    edited.write_parquet(tmp_path / "edited.parquet")
    with Store.open(db, read_only=True) as store:
        before = {t: store.read(t) for t in (table, "label_events", "record_events", "gate_events")}
    refused = runner.invoke(app, ["import", str(tmp_path / "edited.parquet"), "--db", str(db), "--table", table])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) <= 4, said
    assert f"would change the stored {table} row" in said and "(10 stored row(s) in all)" in said
    assert "--replace" in said
    with Store.open(db, read_only=True) as store:
        assert all(store.read(t).equals(frame) for t, frame in before.items())
    done = runner.invoke(app, ["import", str(tmp_path / "edited.parquet"), "--db", str(db), "--table", table,
                               "--replace"])
    said = " ".join(done.output.split())
    assert done.exit_code == 0, said
    assert f"replaced: 10 stored {table} row(s) changed; gates flagged: " in said and live[:12] in said
    with Store.open(db, read_only=True) as store:
        events = store.read("label_events" if table == "labels" else "record_events")
        assert events.height == 10 and set(events["source"]) == {"edited.parquet"}
        flagged = gates(store).filter(calibration_id=live).row(0, named=True)
        kind = "labels changed" if table == "labels" else "records replaced"
        assert flagged["state"] == "live" and flagged["alerts"][-1].startswith(f"{kind} under this gate: 10 ")
