"""`cic import`: a table written by `cic export` (or any file with a table's columns) upserted into the store —
checked first (`cic.store.imports`), and append-only in effect: rows that would change stored ones are refused
unless `replace`, and then recorded (a label's verdict in `label_events`, every other column in `record_events`,
old and new value) with every gate whose window held a changed record flagged, as `cic ingest --relabel` does."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.alerts import Alert
from cic.pipeline.production.ingest_changes import relabelled_alert, replaced_alert, shown_value
from cic.store.imports import changed_rows, checked_import
from cic.store.ingest_queries import gates_holding_records, gates_touched

if TYPE_CHECKING:
    from cic.store import Store

#: tables whose rows are facts about one record (run_key, question_id): a change there flags the gates holding it
RECORD_TABLES = ("labels", "scores", "generations", "observations")


@dataclass
class ImportStats:
    """What one import did: the table, rows written, stored rows it changed (`replace`), gates it flagged."""

    table: str
    rows: int = 0
    replaced: int = 0
    flagged_gates: list[str] = field(default_factory=list)


def import_table(store: Store, path: str | Path, table: str | None = None, *, replace: bool = False,
                 now: datetime | None = None) -> ImportStats:
    """Upsert a checked Parquet table; stored rows it would change are refused unless `replace` (then recorded and
    their gates flagged, in the same transaction as the rows)."""
    from cic.store.database import as_table_frame

    name, arrow = checked_import(path, table, schema.TABLES)
    frame = as_table_frame(name, arrow)
    source, now = Path(path).name, now or datetime.now(UTC)
    with store.scratch("import") as tmp:
        staged = str(Path(tmp) / "rows.parquet")
        frame.write_parquet(staged)
        changed = changed_rows(store, name, staged)
        stats = ImportStats(name, replaced=changed.get_column("key").n_unique())
        if changed.height and not replace:
            raise UserError(_refusal(path, name, changed))
        with store.transaction():
            if changed.height:
                stats.flagged_gates = _record(store, name, changed, source, now, Path(tmp))
            stats.rows = store.upsert(name, frame)
    return stats


def _refusal(path: str | Path, table: str, changed: pl.DataFrame) -> str:
    row = changed.row(0, named=True)
    events = "label_events" if table == "labels" else "record_events"
    return (f"path = {str(path)!r}: would change the stored {table} row {row['key']}: {row['field']} from "
            f"{shown_value(row['old_value'])} to {shown_value(row['new_value'])} "
            f"({changed.get_column('key').n_unique()} stored row(s) in all); stored facts are append-only — pass "
            f"--replace to change them (recorded in {events}, and every gate whose window held them is flagged)")


def _record(store: Store, table: str, changed: pl.DataFrame, source: str, now: datetime, scratch: Path) -> list[str]:
    """Each change as an event, and the flags on the gates whose window held a changed record."""
    from cic.pipeline.gates.lifecycle import flag_gates

    alerts: dict[str, Alert] = {}
    verdicts = changed.filter(pl.col("field") == "aligned") if table == "labels" else changed.clear()
    if verdicts.height:
        events = verdicts.with_columns(criterion=pl.col("key").str.json_path_match("$.criterion"),
                                       old_aligned=pl.col("old_value") == "true",
                                       new_aligned=pl.col("new_value") == "true")
        store.upsert("label_events", events.select(
            pl.struct("run_key", "question_id", "criterion").map_elements(
                lambda r: schema.value_hash(r, now.isoformat(), source), return_dtype=pl.String).alias("event_id"),
            "run_key", "question_id", "criterion", "old_aligned", "new_aligned", pl.lit(source).alias("source"),
            pl.lit(now).alias("created_at")))
        files = str(scratch / "relabelled.parquet")
        events.select("run_key", "question_id", "criterion").write_parquet(files)
        for gate, n in gates_touched(store, files).items():
            alerts[gate] = relabelled_alert(n, source, now)
    others = changed.filter(pl.col("field") != "aligned") if table == "labels" else changed
    if others.height:
        per_record = table in RECORD_TABLES
        store.upsert("record_events", others.select(
            pl.struct("key", "field").map_elements(lambda r: schema.value_hash(r, now.isoformat(), source),
                                                   return_dtype=pl.String).alias("event_id"),
            pl.lit(table).alias("table_name"), "run_key", "question_id",
            (pl.col("field") if per_record else pl.col("field") + pl.lit(" of ") + pl.col("key")).alias("field"),
            "old_value", "new_value", pl.lit(source).alias("source"), pl.lit(now).alias("created_at")))
        if per_record:
            files = str(scratch / "replaced.parquet")
            others.select("run_key", "question_id", pl.lit(None, dtype=pl.Datetime("us", "UTC")).alias("new_at")) \
                .unique().write_parquet(files)
            for gate, n in gates_holding_records(store, files).items():
                alerts.setdefault(gate, replaced_alert(n, source, now))
    return flag_gates(store, alerts, caused_at=now)
