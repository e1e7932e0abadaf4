"""What an ingest changes in stored history — labels (`relabel`) and records (`replace`) — found in its staged
files, refused unless allowed, and, when allowed, recorded as events that flag the gates whose window held them.
A completion of a cut-off ingest asks the same of what later ingests stored meanwhile (`later`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.alerts import RELABELLED, REPLACED, Alert
from cic.pipeline.production.ingest_options import IngestStats
from cic.store.ingest_queries import Files, changed_labels, changed_records, gates_holding_records, gates_touched

if TYPE_CHECKING:
    from cic.store import Store

#: (digest, started_at) of a cut-off ingest being completed: only what ingests started after it stored counts
Later = tuple[str, datetime]


class Stage:
    """Staged Parquet files of one ingest (records, scores, labels, label keys, changes), in a temporary directory
    beside the store; removed when the ingest ends, stored or not."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.files: dict[str, list[str]] = {"records": [], "scores": [], "labels": [], "keys": [], "changed": [],
                                              "replaced": []}

    def add(self, kind: str, frame: pl.DataFrame) -> str:
        path = self.dir / f"{kind}-{len(self.files[kind]):06d}.parquet"
        frame.write_parquet(path)
        self.files[kind].append(str(path))
        return str(path)

    def has(self, kind: str) -> bool:
        return bool(self.files[kind])


def _refusal(row: dict[str, object], name: str, old: str, new: str, later: Later | None, option: str) -> str:
    """A refused change in words — a fresh ingest's, or a completion's over what a later ingest stored — with the
    way out."""
    where = f"model {row['model']!r}, stream {row['stream']!r}"
    head = f"record {row['record']} (question_id {row['question_id']!r}): "
    if later is None:
        return (head + f"would change the stored {name} of {where} from {old} to {new}", f"history is append-only — "
                f"pass {option} to change them")
    return (head + f"a later ingest stored {name} {old} for {where}, where this file says {new}", f"completing it "
            f"would overwrite what that ingest stored — pass {option} with the completion to let this file's values "
            f"win, or abandon this ingest (`cic ingest --abandon {later[0][:12]}`) to keep the later ones")


def checked_labels(store: Store, labels: Files, source: str, relabel: bool, later: Later | None = None
                   ) -> pl.DataFrame | None:
    """Stored labels the staged ones would change: refused unless `relabel` (then returned, to be recorded)."""
    if not labels:
        return None
    changed = changed_labels(store, labels, later)
    if changed.height == 0:
        return None
    if not relabel:
        row = changed.row(0, named=True)
        change, way_out = _refusal(row, f"{row['criterion']} label", "correct" if row["old_aligned"] else "wrong",
                                   "correct" if row["new_aligned"] else "wrong", later, "--relabel")
        raise UserError(f"{source} {change} ({changed.height} stored label(s) in all); {way_out} (recorded in "
                         "label_events, and every gate whose window held them is flagged)")
    return changed


def checked_records(store: Store, records: Files, scores: Files, source: str, replace: bool,
                    later: Later | None = None) -> pl.DataFrame | None:
    """Stored records the staged ones would change in any field (question, answer, timestamp, gold, a score):
    refused unless `replace` (then returned, to be recorded)."""
    if not records:
        return None
    changed = changed_records(store, records, scores, later)
    if changed.height == 0:
        return None
    if not replace:
        row = changed.row(0, named=True)
        change, way_out = _refusal(row, row["field"], shown_value(row["old_value"]), shown_value(row["new_value"]),
                                   later, "--replace")
        raise UserError(f"{source} {change} ({changed.height} field(s) of {changed.get_column('record').n_unique()} "
                         f"stored record(s) in all); {way_out} (recorded in record_events, and every gate whose "
                         "window held them is flagged)")
    return changed


def shown_value(value: str | None, limit: int = 60) -> str:
    """A stored value as a refusal quotes it: repr, cut to `limit` characters."""
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def relabelled_alert(n: int, source: str, now: datetime) -> Alert:
    """The flag a gate gets when labels in its window were relabelled (the abandon path matches its wording)."""
    return Alert(RELABELLED, f"labels changed under this gate: {n} label(s) in its window relabelled by {source} at "
                             f"{now:%Y-%m-%d %H:%M} UTC; recalibrate and review before trusting it")


def replaced_alert(n: int, source: str, now: datetime) -> Alert:
    """The flag a gate gets when records in its window were replaced (the abandon path matches its wording)."""
    return Alert(REPLACED, f"records replaced under this gate: {n} record(s) in its window rewritten by {source} at "
                           f"{now:%Y-%m-%d %H:%M} UTC; recalibrate and review before trusting it")


@dataclass(frozen=True)
class Changes:
    """What an ingest changes in stored history, each allowed by its flag: labels (`relabel`) and records
    (`replace`), as the checks found them; None where nothing changes."""

    labels: pl.DataFrame | None = None
    records: pl.DataFrame | None = None

    def __bool__(self) -> bool:
        return self.labels is not None or self.records is not None


def record_changes(store: Store, stage: Stage, changes: Changes, source: str, now: datetime,
                   stats: IngestStats) -> None:
    """Inside the writing transaction, before the new values: record each change as an event (old and new value)
    and flag every gate whose window held a changed record (`label_events`, `record_events`)."""
    from cic.pipeline.gates.lifecycle import flag_gates

    alerts: dict[str, Alert] = {}
    if changes.labels is not None:
        changed = changes.labels
        store.upsert("label_events", changed.select(
            pl.struct("run_key", "question_id", "criterion").map_elements(
                lambda r: schema.value_hash(r, now.isoformat(), source), return_dtype=pl.String)
            .alias("event_id"), "run_key", "question_id", "criterion", "old_aligned", "new_aligned",
            pl.lit(source).alias("source"), pl.lit(now).alias("created_at")))
        stats.relabelled = changed.height
        for gate, n in gates_touched(store, stage.add("changed", changed)).items():
            alerts[gate] = relabelled_alert(n, source, now)
    if changes.records is not None:
        changed = changes.records
        store.upsert("record_events", changed.select(
            pl.struct("run_key", "question_id", "field").map_elements(
                lambda r: schema.value_hash(r, now.isoformat(), source), return_dtype=pl.String)
            .alias("event_id"), "table_name", "run_key", "question_id", "field", "old_value", "new_value",
            pl.lit(source).alias("source"), pl.lit(now).alias("created_at")))
        stats.replaced = changed.get_column("record").n_unique()
        held = gates_holding_records(store, stage.add("replaced", changed.select("run_key", "question_id", "new_at")
                                                      .unique()))
        for gate, n in held.items():
            alerts[gate] = replaced_alert(n, source, now)
    stats.flagged_gates = flag_gates(store, alerts, caused_at=now)
