"""Undoing an unfinished ingest (`cic ingest --abandon`): everything it stored removed, the records and labels it
replaced put back, in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cic.store.layout import StoreError

if TYPE_CHECKING:
    import duckdb

    from cic.store.database import Store

ABANDON_STEPS = 18  # the statements `delete_ingest_rows` runs, for its progress

#: how `delete_ingest_rows` puts back a record field an abandoned ingest replaced (`record_events`): the table,
#: the column, its old value from the event's text, and how the row is found from the event `e`
RESTORES = (
    ("generations", "text", "e.old_value", "t.run_key = e.run_key AND t.question_id = e.question_id AND "
                                           "t.sample_index = 0", "answer"),
    ("observations", "observed_at", "CAST(e.old_value AS TIMESTAMPTZ)",
     "t.run_key = e.run_key AND t.question_id = e.question_id", "timestamp"),
    ("scores", "value", "CAST(e.old_value AS DOUBLE)", "t.run_key = e.run_key AND t.question_id = e.question_id AND "
                                                       "e.field = 'score:' || t.estimator", None),
    ("questions", "question", "e.old_value", "t.question_id = e.question_id AND EXISTS (SELECT 1 FROM runs r WHERE "
                                             "r.run_key = e.run_key AND t.dataset = r.dataset AND "
                                             "t.split = 'production:' || r.model)",
     "question"),
    ("questions", "answer", "e.old_value", "t.question_id = e.question_id AND EXISTS (SELECT 1 FROM runs r WHERE "
                                           "r.run_key = e.run_key AND t.dataset = r.dataset AND "
                                           "t.split = 'production:' || r.model)",
     "gold"),
)


def _as_event_text(column: str) -> str:
    """A stored column as `record_events` writes its values (`cic.store.ingest_queries.changed_records`)."""
    if column == "observed_at":
        return "strftime(t.observed_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ')"
    return f"CAST(t.{column} AS VARCHAR)"


def delete_ingest_rows(store: Store, *, stamp: datetime, digest: str, records: Sequence[str] | None,
                       labels: Sequence[str] | None, step: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Delete what an unfinished ingest (`digest`, stamped `stamp`) stored first, so it can be abandoned; rows an
    earlier ingest stored stay, and so do rows another ingest (done or unfinished) wrote since — a later complete
    file holds them; relabelled labels and replaced record fields (`record_events`) get their old value back unless
    another ingest rewrote them, and the gate flags its changes raised go. Runs inside the caller's transaction.
    `records` / `labels`: its staged Parquet files, narrowing the rows to its keys (None: gone, the stamp alone
    decides). `step` hears (statements done, ABANDON_STEPS) after each one: on 10^6 records each takes tens of
    seconds. Returns rows deleted (or restored) per table."""
    if store.read_only:
        raise StoreError(f"{store!r} was opened read-only; open it without read_only to write")
    abandon = _Abandon(store._con, stamp, digest, step)
    abandon.mark(records)
    try:
        abandon.delete_records()
        abandon.restore()
        abandon.delete_labels(labels)
        abandon.reattribute()
    finally:
        abandon.con.execute("DROP TABLE IF EXISTS cic_abandoned")
    return abandon.done


class _Abandon:
    """One abandon's statements (`delete_ingest_rows`), each counted for its progress; `done`: rows per table."""

    KEPT = "NOT (ingest IS NOT NULL AND ingest <> ?)"  # another ingest wrote the row since: it holds it

    def __init__(self, con: duckdb.DuckDBPyConnection, stamp: datetime, digest: str,
                 step: Callable[[int, int], None] | None) -> None:
        self.con, self.stamp, self.digest, self.step = con, stamp, digest, step
        self.finished = 0
        self.done: dict[str, int] = {}

    def execute(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        result = self.con.execute(sql, list(params)).fetchall()
        self.finished += 1
        if self.step is not None:
            self.step(self.finished, ABANDON_STEPS)
        return result

    def run(self, sql: str, params: Sequence[Any]) -> int:
        result = self.execute(sql, params)
        return int(result[0][0]) if result else 0

    def mark(self, records: Sequence[str] | None) -> None:
        """The records it stored that no other ingest holds, into a temporary table (`cic_abandoned`)."""
        abandoned = ("CREATE OR REPLACE TEMP TABLE cic_abandoned AS SELECT run_key, question_id FROM observations "
                     f"WHERE created_at = ? AND {self.KEPT}")
        if records is None:
            self.execute(abandoned, [self.stamp, self.digest])
        elif records:
            self.execute(abandoned + " AND (run_key, question_id) IN (SELECT run_key, question_id FROM "
                         "read_parquet(?))", [self.stamp, self.digest, list(records)])
        else:
            self.execute(abandoned + " AND false", [self.stamp, self.digest])

    def delete_records(self) -> None:
        """Its records' questions, generations and scores."""
        self.done["questions"] = self.run(
            "DELETE FROM questions q WHERE EXISTS (SELECT 1 FROM cic_abandoned a JOIN runs r USING (run_key) WHERE "
            "q.dataset = r.dataset AND q.split = 'production:' || r.model AND q.question_id = a.question_id)", [])
        for table in ("generations", "scores"):
            self.done[table] = self.run(f"DELETE FROM {table} WHERE (run_key, question_id) IN "
                                        "(SELECT run_key, question_id FROM cic_abandoned)", [])

    def restore(self) -> None:
        """The labels it relabelled and the record fields it replaced, back to their old values (unless another
        ingest rewrote them since), and their events gone."""
        self.done["labels restored"] = self.run(
            "UPDATE labels l SET aligned = e.old_aligned, value = CASE WHEN l.value = CAST(e.new_aligned AS DOUBLE) "
            "THEN CAST(e.old_aligned AS DOUBLE) ELSE l.value END FROM label_events e WHERE e.created_at = ? AND "
            "l.run_key = e.run_key AND l.question_id = e.question_id AND l.criterion = e.criterion AND "
            "l.aligned IS NOT DISTINCT FROM e.new_aligned AND NOT (l.ingest IS NOT NULL AND l.ingest <> ?)",
            [self.stamp, self.digest])
        restored = 0
        for table, column, old, where, field in RESTORES:  # records it replaced that nothing rewrote since
            restored += self.run(
                f"UPDATE {table} t SET {column} = {old} FROM record_events e WHERE e.created_at = ? AND "
                + (f"e.field = '{field}' AND " if field else "e.field LIKE 'score:%' AND ")
                + f"{where} AND {_as_event_text(column)} IS NOT DISTINCT FROM e.new_value AND EXISTS (SELECT 1 "
                "FROM observations o WHERE o.run_key = e.run_key AND o.question_id = e.question_id AND o.ingest = ?)",
                [self.stamp, self.digest])
        self.done["records restored"] = restored
        self.done["record_events"] = self.run("DELETE FROM record_events WHERE created_at = ?", [self.stamp])

    def delete_labels(self, labels: Sequence[str] | None) -> None:
        """Its labels, their events, and the gate flags its relabels or replacements raised (by their cause,
        `gate_events.caused_at`) where nothing happened to the gate since."""
        where, params = f"created_at = ? AND {self.KEPT}", [self.stamp, self.digest]
        if labels is not None:
            where += (" AND (run_key, question_id, criterion) IN (SELECT run_key, question_id, criterion "
                      "FROM read_parquet(?))") if labels else " AND false"
            params += [list(labels)] if labels else []
        self.done["labels"] = self.run(f"DELETE FROM labels WHERE ({where}) OR (run_key, question_id) IN "
                                       "(SELECT run_key, question_id FROM cic_abandoned)", params)
        self.done["label_events"] = self.run("DELETE FROM label_events WHERE created_at = ?", [self.stamp])
        self.done["gate_events"] = self.run(
            "DELETE FROM gate_events g WHERE g.caused_at = ? AND g.created_at = (SELECT max(created_at) FROM "
            "gate_events h WHERE h.calibration_id = g.calibration_id)", [self.stamp])

    def reattribute(self) -> None:
        """Its records' observations gone; rows it rewrote that stay, written last by their first ingest; the
        production runs it registered that hold nothing now gone."""
        self.done["observations"] = self.run("DELETE FROM observations WHERE (run_key, question_id) IN "
                                             "(SELECT run_key, question_id FROM cic_abandoned)", [])
        for table in ("labels", "observations"):
            self.execute(f"UPDATE {table} t SET ingest = (SELECT min(i.digest) FROM ingests i WHERE i.started_at = "
                         "t.created_at AND i.digest <> ?) WHERE t.ingest = ?", [self.digest, self.digest])
        self.done["runs"] = self.run(
            "DELETE FROM runs r WHERE r.split = 'production' AND r.created_at >= ? AND " + " AND ".join(
                f"NOT EXISTS (SELECT 1 FROM {t} x WHERE x.run_key = r.run_key)"
                for t in ("observations", "generations", "scores", "labels", "calibrations")), [self.stamp])
