"""The ingest's statements over its staged Parquet batches: the checks that read them against the store, and the
writes that move them in (by column name). Each takes the staged file(s) as its one data parameter."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from cic.store.database import Store

Files = str | Sequence[str]


def _first(rows: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    return rows[0] if rows else None


def stored_answers(store: Store, keys: Files) -> pl.DataFrame:
    """(record, text) of each staged key's stored greedy answer, null where none is stored, by record."""
    return store.sql_frame(
        "SELECT k.record, g.text FROM read_parquet(?) k LEFT JOIN generations g ON g.run_key = k.run_key AND "
        "g.question_id = k.question_id AND g.sample_index = 0 ORDER BY k.record", [keys])


def first_repeated_key(store: Store, keys: Files) -> tuple[Any, ...] | None:
    """(model, stream, question_id, first records) of the first (model, stream, question_id) staged twice."""
    return _first(store.sql(
        "SELECT model, stream, question_id, list(record ORDER BY record)[1:3] AS records FROM read_parquet(?) "
        "GROUP BY model, stream, question_id HAVING count(*) > 1 ORDER BY min(record) LIMIT 1", [keys]))


def first_question_in_two_groups(store: Store, keys: Files) -> tuple[Any, ...] | None:
    """(model, base stream, question_id, two streams, two records) of the first question staged in two groups."""
    return _first(store.sql(
        "SELECT model, base, question_id, list(DISTINCT stream ORDER BY stream)[1:2], list(record ORDER BY record)"
        "[1:2] FROM read_parquet(?) GROUP BY model, base, question_id HAVING count(DISTINCT stream) > 1 "
        "ORDER BY min(record) LIMIT 1", [keys]))


def first_group_clash(store: Store, keys: Files) -> tuple[Any, ...] | None:
    """(record, model, stream, base, stored base) of the first record whose stream is stored grouped differently."""
    return _first(store.sql(
        "SELECT k.record, k.model, k.stream, k.base, json_extract_string(r.generation_config, '$.stream') FROM "
        "read_parquet(?) k JOIN runs r ON r.run_key = k.run_key WHERE coalesce(json_extract_string("
        "r.generation_config, '$.stream'), r.dataset) <> k.base ORDER BY k.record LIMIT 1", [keys]))


def first_group_move(store: Store, keys: Files) -> tuple[Any, ...] | None:
    """(record, model, question_id, stream, stored stream) of the first record stored under another group of its
    stream (or grouped, when this file is not)."""
    return _first(store.sql(
        "SELECT k.record, k.model, k.question_id, k.stream, r.dataset FROM read_parquet(?) k JOIN runs r ON "
        "r.model = k.model AND r.split = 'production' AND r.dataset <> k.stream AND (json_extract_string("
        "r.generation_config, '$.stream') = k.base OR (k.stream <> k.base AND r.dataset = k.base)) JOIN "
        "observations o ON o.run_key = r.run_key AND o.question_id = k.question_id ORDER BY k.record LIMIT 1",
        [keys]))


LATER = ("{alias}.ingest IN (SELECT digest FROM ingests WHERE started_at > ? AND digest <> ?)")


def _later(alias: str, later: tuple[str, datetime] | None) -> tuple[str, list[Any]]:
    """The filter "written last by an ingest started after `later`'s" on a table alias, and its parameters."""
    if later is None:
        return "", []
    return " AND " + LATER.format(alias=alias), [later[1], later[0]]


def changed_labels(store: Store, labels: Files, later: tuple[str, datetime] | None = None) -> pl.DataFrame:
    """Stored labels the staged ones would change: record, run_key, model, stream, question_id, criterion,
    old_aligned, new_aligned, by record. `later` (digest, started_at): only labels written last by an ingest
    started after that one (what a completion would overwrite)."""
    where, params = _later("l", later)
    return store.sql_frame(
        "SELECT n.record, n.run_key, n.model, n.stream, n.question_id, n.criterion, l.aligned AS old_aligned, "
        "n.aligned AS new_aligned FROM read_parquet(?) n JOIN labels l ON l.run_key = n.run_key AND "
        "l.question_id = n.question_id AND l.criterion = n.criterion WHERE l.aligned IS DISTINCT FROM n.aligned"
        f"{where} ORDER BY n.record", [labels, *params])


def changed_records(store: Store, records: Files, scores: Files, later: tuple[str, datetime] | None = None
                    ) -> pl.DataFrame:
    """Stored facts the staged records would change: record, run_key, model, stream, question_id, table_name,
    field (question, answer, timestamp, gold, score:<estimator>), old_value, new_value (as text), new_at (the
    record's staged time), by record and field. Only records the store holds (an observation) are compared; a
    staged record without gold compares as gold '' (what it would store). `later`: only records written last by
    an ingest started after that one, as `changed_labels`."""
    import polars as pl

    where, params = _later("o", later)

    facts = store.sql_frame(
        "WITH k AS (SELECT k.record, k.run_key, k.model, k.stream, k.question_id, q.question AS old_question, "
        "k.question AS new_question, g.text AS old_answer, k.answer AS new_answer, o.observed_at AS old_at, "
        "k.observed_at AS new_at, q.answer AS old_gold, coalesce(k.gold, '') AS new_gold FROM read_parquet(?) k "
        f"JOIN observations o ON o.run_key = k.run_key AND o.question_id = k.question_id{where} "
        "LEFT JOIN questions q ON q.dataset = k.stream AND q.split = 'production:' || k.model AND "
        "q.question_id = k.question_id LEFT JOIN generations g ON g.run_key = k.run_key AND "
        "g.question_id = k.question_id AND g.sample_index = 0) "
        "SELECT record, run_key, model, stream, question_id, 'questions' AS table_name, 'question' AS field, "
        "old_question AS old_value, new_question AS new_value, new_at FROM k "
        "WHERE old_question IS DISTINCT FROM new_question "
        "UNION ALL SELECT record, run_key, model, stream, question_id, 'generations', 'answer', old_answer, "
        "new_answer, new_at "
        "FROM k WHERE old_answer IS DISTINCT FROM new_answer "
        "UNION ALL SELECT record, run_key, model, stream, question_id, 'observations', 'timestamp', "
        "strftime(old_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ'), "
        "strftime(new_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ'), new_at FROM k "
        "WHERE old_at IS DISTINCT FROM new_at "
        "UNION ALL SELECT record, run_key, model, stream, question_id, 'questions', 'gold', old_gold, new_gold, "
        "new_at FROM k "
        "WHERE old_gold IS DISTINCT FROM new_gold", [records, *params])
    where, params = _later("ob", later)
    values = store.sql_frame(
        "SELECT k.record, k.run_key, k.model, k.stream, k.question_id, 'scores' AS table_name, "
        "'score:' || s.estimator AS field, CAST(o.value AS VARCHAR) AS old_value, "
        "CAST(s.value AS VARCHAR) AS new_value, k.observed_at AS new_at "
        "FROM read_parquet(?) s JOIN scores o ON o.run_key = s.run_key AND o.question_id = s.question_id AND "
        "o.estimator = s.estimator JOIN read_parquet(?) k ON k.run_key = s.run_key AND k.question_id = s.question_id "
        "JOIN observations ob ON ob.run_key = s.run_key AND ob.question_id = s.question_id "
        f"WHERE o.value IS DISTINCT FROM s.value{where}", [scores, records, *params])
    return pl.concat([facts, values]).sort("record", "field")


#: system gate id → how many changed (run_key, question_id, criterion) rows are among its questions in one of its
#: stages' runs, for its criterion (a system gate's "window" is its questions); and the same for changed records
#: (run_key, question_id), any criterion
_SYSTEM_LABELS = (
    "WITH g AS (SELECT calibration_id, criterion, unnest(run_keys) AS run_key, question_ids FROM calibrations "
    "WHERE system IS NOT NULL), "
    "q AS (SELECT calibration_id, criterion, run_key, unnest(question_ids) AS question_id FROM g) "
    "SELECT q.calibration_id, count(*) FROM q JOIN (SELECT DISTINCT run_key, question_id, criterion FROM "
    "read_parquet(?)) ch ON q.run_key = ch.run_key AND q.question_id = ch.question_id AND q.criterion = ch.criterion "
    "GROUP BY q.calibration_id")
_SYSTEM_RECORDS = (
    "WITH g AS (SELECT calibration_id, unnest(run_keys) AS run_key, question_ids FROM calibrations "
    "WHERE system IS NOT NULL), q AS (SELECT calibration_id, run_key, unnest(question_ids) AS question_id FROM g) "
    "SELECT q.calibration_id, count(*) FROM q JOIN (SELECT DISTINCT run_key, question_id FROM read_parquet(?)) ch "
    "ON q.run_key = ch.run_key AND q.question_id = ch.question_id GROUP BY q.calibration_id")


def gates_holding_records(store: Store, changed: Files) -> dict[str, int]:
    """gate id → how many of the changed records (run_key, question_id, new_at) lie in its window, at their stored
    time or at the time the change gives them (a gate without a window holds them all, and so does every gate of
    the run when a record has no time; every criterion of the run); a system gate holds the records of its
    questions in each stage's run."""
    return _single_records(store, changed) | {gate_id: int(n) for gate_id, n in store.sql(_SYSTEM_RECORDS, [changed])}


def _single_records(store: Store, changed: Files) -> dict[str, int]:
    """`gates_holding_records` of single gates: by window."""
    rows = store.sql(
        "SELECT c.calibration_id, count(DISTINCT t.question_id) FROM calibrations c JOIN ("
        "  SELECT DISTINCT ch.run_key, ch.question_id, o.observed_at AS old_at, ch.new_at "
        "  FROM read_parquet(?) ch LEFT JOIN observations o ON o.run_key = ch.run_key AND "
        "o.question_id = ch.question_id) t ON c.run_key = t.run_key AND (t.old_at IS NULL OR "
        "  ((c.window_from IS NULL OR t.old_at >= c.window_from) AND (c.window_to IS NULL OR t.old_at <= c.window_to))"
        "  OR ((c.window_from IS NULL OR t.new_at >= c.window_from) AND (c.window_to IS NULL OR t.new_at <= "
        "c.window_to))) GROUP BY c.calibration_id", [changed])
    return {gate_id: int(n) for gate_id, n in rows}


def staged_streams(store: Store, keys: Files) -> list[tuple[str, str, str]]:
    """Every staged (model, stream, base stream), ordered."""
    return store.sql("SELECT DISTINCT model, stream, base FROM read_parquet(?) ORDER BY model, stream", [keys])


def new_record_count(store: Store, keys: Files) -> int:
    """How many staged records the store does not hold yet (the rest rewrite stored ones)."""
    return int(store.sql("SELECT count(*) FROM read_parquet(?) k WHERE NOT EXISTS (SELECT 1 FROM observations o "
                         "WHERE o.run_key = k.run_key AND o.question_id = k.question_id)", [keys])[0][0])


def staged_label_count(store: Store, labels: Files) -> int:
    """How many (run, question) pairs the staged labels cover."""
    return int(store.sql("SELECT count(*) FROM (SELECT DISTINCT run_key, question_id FROM read_parquet(?))",
                         [labels])[0][0])


def gates_touched(store: Store, changed: Files) -> dict[str, int]:
    """gate id → how many of the changed labels lie in its window (a gate without a window holds them all);
    a record's time is when production saw it, else when its label was first stored. A system gate is touched by
    a changed label of its criterion on one of its questions in one of its stages' runs."""
    return _single_labels(store, changed) | {gate_id: int(n) for gate_id, n in store.sql(_SYSTEM_LABELS, [changed])}


def _single_labels(store: Store, changed: Files) -> dict[str, int]:
    """`gates_touched` of single gates: by window."""
    rows = store.sql(
        "SELECT c.calibration_id, count(*) FROM calibrations c JOIN ("
        "  SELECT ch.run_key, ch.criterion, coalesce(o.observed_at, l.created_at) AS seen_at FROM read_parquet(?) ch "
        "  JOIN labels l ON l.run_key = ch.run_key AND l.question_id = ch.question_id AND l.criterion = ch.criterion "
        "  LEFT JOIN observations o ON o.run_key = ch.run_key AND o.question_id = ch.question_id) t "
        "ON c.run_key = t.run_key AND c.criterion = t.criterion "
        "AND (c.window_from IS NULL OR t.seen_at >= c.window_from) "
        "AND (c.window_to IS NULL OR t.seen_at <= c.window_to) "
        "GROUP BY c.calibration_id", [changed])
    return {gate_id: int(n) for gate_id, n in rows}


def unfinished_ingest_files(store: Store) -> list[str]:
    """Files whose ingest journal says 'writing' (cut off between commits), oldest first."""
    return [f for (f,) in store.sql("SELECT file FROM ingests WHERE state = 'writing' ORDER BY started_at")]


def write_staged(store: Store, kind: str, files: Sequence[str], source: str, now: datetime, split: str,
                 ingest: str) -> None:
    """Upsert one kind of staged batch ("records", "scores" or "labels") into its tables, column by name.
    Production questions are kept per model: their split is `<split>:<model>`; observations and labels name the
    ingest (its digest) that wrote them last, so abandoning another ingest never removes them."""
    if kind == "records":
        store.upsert_select("questions", "SELECT stream AS dataset, ? || model AS split, question_id, question, "
                            "NULL::VARCHAR[] AS choices, NULL::VARCHAR[] AS choice_labels, coalesce(gold, '') AS "
                            "answer, []::VARCHAR[] AS aliases FROM read_parquet(?)", [f"{split}:", list(files)])
        store.upsert_select("generations", "SELECT run_key, question_id, 0 AS sample_index, answer AS text, "
                            "NULL::INTEGER AS n_tokens, NULL::DOUBLE AS logprob_sum, NULL::DOUBLE AS logprob_mean, "
                            "NULL::BOOLEAN AS is_greedy, NULL::DOUBLE[] AS option_probs, ['ingested'] AS flags "
                            "FROM read_parquet(?)", [list(files)])
        store.upsert_select("observations", "SELECT run_key, question_id, observed_at, ? AS source, ? AS created_at, "
                            "? AS ingest FROM read_parquet(?)", [source, now, ingest, list(files)])
    elif kind == "scores":
        store.upsert_select("scores", "SELECT run_key, question_id, estimator, value FROM read_parquet(?)",
                            [list(files)])
    elif kind == "labels":
        store.upsert_select("labels", "SELECT run_key, question_id, criterion, aligned, value, ? AS created_at, "
                            "? AS ingest FROM read_parquet(?)", [now, ingest, list(files)])
    else:
        raise ValueError(f"kind = {kind!r}: one of records, scores, labels")
