"""Named read queries of the stages above the store: every joined or grouped statement written once, here (the
store's `read` covers equality filters on one table)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cic import schema
from cic.store.probe_queries import refuse_fit_questions

if TYPE_CHECKING:
    import polars as pl

    from cic.store.database import Store


def latest_results(store: Store, run_keys: Sequence[str]) -> pl.DataFrame:
    """The split-protocol rows of the models × datasets of these runs, the newest per (model, dataset, estimator,
    criterion, alpha, bound, search), ordered by that key."""
    return store.sql_frame(
        "SELECT e.model, e.dataset, e.estimator, e.criterion, e.alpha, e.bound, e.search, e.fdr_mean, e.fdr_std, "
        "e.coverage_mean, e.fails, e.n_splits, e.delta, e.n_cal, e.base_error_rate, e.score_limit, e.ceiling "
        "FROM evaluations e JOIN "
        "(SELECT DISTINCT model, dataset FROM runs WHERE list_contains(?, run_key)) r USING (model, dataset) "
        "QUALIFY row_number() OVER (PARTITION BY e.model, e.dataset, e.estimator, e.criterion, e.alpha, e.bound, "
        "e.search ORDER BY e.created_at DESC) = 1 ORDER BY 1, 2, 3, 4, 5, 6, 7", [list(run_keys)])


def latest_group_results(store: Store, run_keys: Sequence[str]) -> pl.DataFrame:
    """The per-dataset split-protocol rows (`group_evaluations`) of these runs' models, the newest study per
    (model, estimator, criterion)."""
    return store.sql_frame(
        "SELECT g.* EXCLUDE (created_at) FROM group_evaluations g WHERE g.model IN (SELECT model FROM runs WHERE "
        "list_contains(?, run_key)) QUALIFY g.evaluation_id = first_value(g.evaluation_id) OVER (PARTITION BY "
        "g.model, g.estimator, g.criterion ORDER BY g.created_at DESC, g.evaluation_id) "
        "ORDER BY g.model, g.estimator, g.criterion, g.bound, g.alpha, g.dataset, g.gate", [list(run_keys)])


#: the scored records of a run that hold no label for one of the run's criteria: when their label window has
#: closed they count as errors (worst-case imputation); `stored_at` is when the record itself was stored
_UNLABELLED = (
    "SELECT s.run_key, s.estimator, c.criterion, s.question_id, s.value AS score, CAST(1 AS TINYINT) AS error, "
    "coalesce(o.observed_at, r.created_at) AS seen_at, CAST(NULL AS TIMESTAMPTZ) AS labelled_at, "
    "coalesce(o.created_at, r.created_at) AS stored_at, FALSE AS labelled "
    "FROM scores s JOIN runs r ON r.run_key = s.run_key "
    "JOIN (SELECT DISTINCT run_key, criterion FROM labels WHERE run_key IN (SELECT unnest(?))) c "
    "ON c.run_key = s.run_key "
    "LEFT JOIN observations o ON o.run_key = s.run_key AND o.question_id = s.question_id "
    "WHERE s.run_key IN (SELECT unnest(?)) AND s.value IS NOT NULL AND (? IS NULL OR s.estimator = ?) "
    "AND (? IS NULL OR c.criterion = ?) AND NOT EXISTS (SELECT 1 FROM labels l WHERE l.run_key = s.run_key "
    "AND l.question_id = s.question_id AND l.criterion = c.criterion)")

_LABELLED = (
    "SELECT s.run_key, s.estimator, l.criterion, s.question_id, s.value AS score, "
    "CAST(NOT l.aligned AS TINYINT) AS error, coalesce(o.observed_at, l.created_at) AS seen_at, "
    "l.created_at AS labelled_at, coalesce(o.created_at, l.created_at) AS stored_at, TRUE AS labelled "
    "FROM scores s JOIN labels l ON s.run_key = l.run_key AND s.question_id = l.question_id "
    "LEFT JOIN observations o ON o.run_key = s.run_key AND o.question_id = s.question_id "
    "WHERE s.run_key IN (SELECT unnest(?)) AND s.value IS NOT NULL AND (? IS NULL OR s.estimator = ?) "
    "AND (? IS NULL OR l.criterion = ?)")


_ORDER = " ORDER BY run_key, estimator, criterion, seen_at, question_id"
_LABELLED_PAIRS = "SELECT * FROM (" + _LABELLED + ")" + _ORDER
_ALL_PAIRS = "SELECT * FROM (" + _LABELLED + " UNION ALL " + _UNLABELLED + ")" + _ORDER


def _pairs(store: Store, run_keys: Sequence[str], estimator: str | None, criterion: str | None,
           missing: bool) -> pl.DataFrame:
    keys = list(run_keys)
    params: list[Any] = [keys, estimator, estimator, criterion, criterion]
    if not missing:
        pairs = store.sql_frame(_LABELLED_PAIRS, params).rename({"seen_at": "at"})
    else:
        pairs = store.sql_frame(_ALL_PAIRS, [*params, keys, keys, estimator, estimator, criterion, criterion]) \
            .rename({"seen_at": "at"})
    refuse_fit_questions(store, pairs)
    return pairs



def labelled_pairs_of_runs(store: Store, run_keys: Sequence[str], *, estimator: str | None = None,
                           criterion: str | None = None, missing: bool = False) -> pl.DataFrame:
    """The pairs of every group of these runs (or of one estimator / criterion) in one query: (run_key,
    estimator, criterion, question_id, score, error, at, labelled), each group's rows oldest first (seen at the
    record's observation time, else the label's). `missing`: also every scored record without a label for a
    criterion the run has, as an error (`labelled` false; seen when observed, else when its run was made): what a
    certificate counts once the record's label window has closed, unless labels are assumed missing at random."""
    return _pairs(store, run_keys, estimator, criterion, missing).drop("labelled_at", "stored_at")


def certified_pairs_of_runs(store: Store, run_keys: Sequence[str], *, estimator: str | None = None,
                            criterion: str | None = None, missing: bool = False) -> pl.DataFrame:
    """`labelled_pairs_of_runs` of these runs plus `labelled_at`, when each label was stored, and `stored_at`,
    when its record was: what rebuilds a stored gate's pairs (a label or record stored after the gate cannot have
    been among them; a record it counted unlabelled counts as an error again)."""
    return _pairs(store, run_keys, estimator, criterion, missing)


_PEOPLE = ("SELECT run_key, question_id, CAST(NOT aligned AS DOUBLE) AS human, created_at AS human_at FROM labels "
           "WHERE run_key IN (SELECT unnest(?)) AND criterion = ?")


def judged_pairs_of_runs(store: Store, run_keys: Sequence[str], *, judge: str, people: str,
                         estimator: str | None = None, missing: bool = False, certified: bool = False
                         ) -> pl.DataFrame:
    """The judge's pairs of these runs (`labelled_pairs_of_runs` of criterion `judge`; `certified_pairs_of_runs`
    with `certified`) under criterion `judge+people`, with the people's verdict beside each: `human` 1 / 0 where a
    person labelled the question, null where none did, and `human_at`, when that label was stored (with
    `certified` only). A question people labelled but the judge did not is left out (the judge labels all)."""
    import polars as pl

    keys = list(run_keys)
    pairs = _pairs(store, keys, estimator, judge, missing)
    verdicts = store.sql_frame(_PEOPLE, [keys, people])
    out = pairs.join(verdicts, on=["run_key", "question_id"], how="left", maintain_order="left") \
        .with_columns(criterion=pl.lit(schema.judged_criterion(judge, people)))
    return out if certified else out.drop("labelled_at", "stored_at", "human_at")


def past_coverage(store: Store, model: str, dataset: str, criterion: str, estimators: Sequence[str], search: str
                  ) -> dict[str, float]:
    """Per estimator (stored name) among `estimators`: the mean share of calibration questions its newest
    single-model pipeline gates of `model` answered on every dataset but `dataset` (same criterion and search,
    every alpha and bound; an unattainable gate answers 0) — how each did on other data; an estimator with no such
    gate is left out."""
    rows = store.sql(
        "SELECT estimator, avg(answered) FROM (SELECT estimator, coalesce(n_accepted, 0) / n_cal AS answered "
        "FROM calibrations WHERE system IS NULL AND coalesce(kind, 'pipeline') = 'pipeline' AND model = ? "
        "AND dataset <> ? AND criterion = ? AND search = ? AND n_cal > 0 AND list_contains(?, estimator) "
        "QUALIFY row_number() OVER (PARTITION BY dataset, estimator, alpha, bound ORDER BY created_at DESC) = 1) "
        "GROUP BY estimator ORDER BY estimator", [model, dataset, criterion, search, list(estimators)])
    return {name: float(value) for name, value in rows}


def ingested_without_labels(store: Store, run_keys: Sequence[str]) -> bool:
    """Whether any record of these runs was ingested without its label (none yet, or one stored by a later
    ingest): its labels come later, so a label window applies by default."""
    return bool(store.sql(
        "SELECT EXISTS (SELECT 1 FROM observations o WHERE o.run_key IN (SELECT unnest(?)) AND NOT EXISTS ("
        "SELECT 1 FROM labels l WHERE l.run_key = o.run_key AND l.question_id = o.question_id "
        "AND l.created_at <= o.created_at))", [list(run_keys)])[0][0])


#: the schema version since which gates are certified by today's rules (`cic.store.migrations._migrate_to_6`)
RULES_VERSION = 6


def made_before_rules(store: Store, calibration_ids: Sequence[str]) -> set[str]:
    """Which of these gates had their first event before the store took today's rules (`RULES_VERSION`): gates
    certified by an earlier version of cic."""
    return {gid for (gid,) in store.sql(
        "SELECT e.calibration_id FROM gate_events e WHERE e.calibration_id IN (SELECT unnest(?)) "
        "GROUP BY e.calibration_id HAVING min(e.created_at) < (SELECT min(applied_at) FROM schema_version "
        "WHERE version >= ?)", [list(calibration_ids), RULES_VERSION])}


def scored_estimators(store: Store, run_key: str) -> list[str]:
    """Estimators with at least two non-null scores in a run, by name."""
    return [e for (e,) in store.sql("SELECT estimator FROM scores WHERE run_key = ? AND value IS NOT NULL "
                                    "GROUP BY estimator HAVING count(*) >= 2 ORDER BY estimator", [run_key])]


def labelled_criteria(store: Store, run_key: str) -> list[str]:
    """Criteria a run has labels for, by name."""
    return [c for (c,) in store.sql("SELECT DISTINCT criterion FROM labels WHERE run_key = ? ORDER BY criterion",
                                    [run_key])]


def last_label_time(store: Store, run_keys: Sequence[str]) -> datetime | None:
    """When the newest label of these runs was written."""
    return store.sql("SELECT max(created_at) FROM labels WHERE run_key IN (SELECT unnest(?))", [list(run_keys)])[0][0]


#: the system gates' rows of `calibrations`, in their columns (the single gates' rows, results included, unread)
_SYSTEM_GATES = ("SELECT " + ", ".join(schema.SYSTEM_GATE_COLUMNS) + " FROM calibrations WHERE system IS NOT NULL "
                 "ORDER BY calibration_id")


def system_gate_frame(store: Store) -> pl.DataFrame:
    """Every stored system gate (a cascade, an estimator chosen) in `schema.SYSTEM_GATE_COLUMNS`, typed as stored."""
    return store.sql_frame(_SYSTEM_GATES).cast({c: schema.CALIBRATIONS.columns[c] for c in schema.SYSTEM_GATE_COLUMNS})


def stored_gate_ids(store: Store, calibration_ids: Sequence[str]) -> set[str]:
    """Which of these ids a stored gate (single or system) has."""
    return {gid for (gid,) in store.sql("SELECT calibration_id FROM calibrations WHERE calibration_id IN "
                                        "(SELECT unnest(?))", [list(calibration_ids)])}


def last_gate_events(store: Store, calibration_ids: Sequence[str]) -> dict[str, datetime]:
    """The time of each gate's newest lifecycle event (gates without one are left out)."""
    return dict(store.sql("SELECT calibration_id, max(created_at) FROM gate_events WHERE calibration_id IN "
                          "(SELECT unnest(?)) GROUP BY calibration_id", [list(calibration_ids)]))


def newest_monitor_rows(store: Store) -> pl.DataFrame:
    """The newest anytime-valid monitor row of each gate."""
    return store.sql_frame("SELECT * FROM gate_monitor QUALIFY row_number() OVER (PARTITION BY calibration_id "
                           "ORDER BY checked_at DESC) = 1")


def loggable_units(store: Store) -> list[dict[str, Any]]:
    """One unit per stored evaluation with the pipeline gates of the same data: run_key, evaluation_id, model,
    dataset, estimator, criterion, data_fingerprint (what `cic log` logs as one MLflow run)."""
    return store.sql_frame(
        "SELECT c.run_key, e.evaluation_id, e.model, e.dataset, e.estimator, e.criterion, e.data_fingerprint "
        "FROM (SELECT DISTINCT evaluation_id, model, dataset, estimator, criterion, data_fingerprint "
        "      FROM evaluations) e "
        "JOIN (SELECT DISTINCT run_key, model, dataset, estimator, criterion, data_fingerprint FROM calibrations "
        "      WHERE (kind = 'pipeline' OR kind IS NULL) AND system IS NULL) c "
        "USING (model, dataset, estimator, criterion, data_fingerprint) ORDER BY 1, 3, 4, 5, 6, 2").to_dicts()


def generated_tokens(store: Store, run_key: str) -> int:
    """Tokens of every answer stored for a run (most-likely answers and samples): what generating it cost."""
    return int(store.sql("SELECT coalesce(sum(n_tokens), 0) FROM generations WHERE run_key = ?", [run_key])[0][0])


def generations_by_question(store: Store, run_key: str) -> pl.DataFrame:
    """question_id, generations: what answering each stored question of a run cost
    (`cic.llm.answering.generations_drawn`: a free-text row is one generation, a multiple-choice question one
    forward pass)."""
    return store.sql_frame("SELECT question_id, CASE WHEN bool_or(option_probs IS NOT NULL) THEN 1 ELSE count(*) "
                           "END::BIGINT AS generations FROM generations WHERE run_key = ? GROUP BY question_id "
                           "ORDER BY question_id", [run_key])


def generations_per_question(store: Store, run_key: str) -> float | None:
    """Answers generated per stored question of a run: the mean of `generations_by_question`; None before any is
    stored."""
    each = generations_by_question(store, run_key)
    return float(each.get_column("generations").mean()) if each.height else None


def generations_in_order(store: Store) -> pl.DataFrame:
    """Every stored answer (the most likely ones and the samples), in drawn order per question."""
    return store.sql_frame("SELECT * FROM generations ORDER BY run_key, question_id, sample_index")


def greedy_errors(store: Store, criterion: str) -> pl.DataFrame:
    """run_key, question_id, wrong (the most likely answer not aligned under `criterion`) of every labelled
    question."""
    return store.sql_frame("SELECT run_key, question_id, NOT aligned AS wrong FROM labels WHERE criterion = ?",
                           [criterion])


def newest_anytime_state(store: Store, run_key: str, estimator: str, criterion: str, alpha: float,
                         delta: float) -> dict[str, Any] | None:
    """The newest row of a key's anytime state (its latest epoch), or None: the key has none yet."""
    rows = store.sql_frame(
        "SELECT * FROM anytime_states WHERE run_key = ? AND estimator = ? AND criterion = ? AND abs(alpha - ?) < 1e-12 "
        "AND abs(delta - ?) < 1e-12 ORDER BY epoch DESC, created_at DESC LIMIT 1",
        [run_key, estimator, criterion, float(alpha), float(delta)])
    return rows.row(0, named=True) if rows.height else None


def anytime_state_row(store: Store, state_id: str, *, first: bool = False) -> dict[str, Any] | None:
    """The newest row of one anytime state (`first`: its first row, written when it started)."""
    order = "ASC" if first else "DESC"
    rows = store.sql_frame(f"SELECT * FROM anytime_states WHERE state_id = ? ORDER BY created_at {order} LIMIT 1",
                           [state_id])
    return rows.row(0, named=True) if rows.height else None


def changes_after_counting(store: Store, state_id: str, run_key: str, criterion: str) -> int:
    """How many answers an anytime state counted had their label (this criterion) or record changed afterwards
    (`label_events`, `record_events`)."""
    return int(store.sql(
        "SELECT count(DISTINCT c.question_id) FROM anytime_counted c JOIN ("
        "  SELECT question_id, created_at FROM label_events WHERE run_key = ? AND criterion = ? UNION ALL "
        "  SELECT question_id, created_at FROM record_events WHERE run_key = ?) e ON e.question_id = c.question_id "
        "WHERE c.state_id = ? AND e.created_at >= c.counted_at", [run_key, criterion, run_key, state_id])[0][0])


def unlabelled_records(store: Store, run_key: str, estimator: str, criterion: str, after: datetime | None,
                       through: datetime) -> int:
    """Records of a run scored by `estimator` and seen in (after, through] that hold no label for `criterion`:
    their label window closed without a label (the anytime rule never counts them)."""
    return int(store.sql(
        "SELECT count(*) FROM observations o JOIN scores s ON s.run_key = o.run_key AND s.question_id = o.question_id "
        "AND s.estimator = ? AND s.value IS NOT NULL WHERE o.run_key = ? AND (? IS NULL OR o.observed_at > ?) "
        "AND o.observed_at <= ? AND NOT EXISTS (SELECT 1 FROM labels l WHERE l.run_key = o.run_key "
        "AND l.question_id = o.question_id AND l.criterion = ?)",
        [estimator, run_key, after, after, through, criterion])[0][0])


def anytime_counted_ids(store: Store, state_id: str) -> set[str]:
    """The question ids an anytime state has counted."""
    return {q for (q,) in store.sql("SELECT question_id FROM anytime_counted WHERE state_id = ?", [state_id])}


def anytime_counted_order(store: Store, state_id: str) -> pl.DataFrame:
    """(question_id, position, counted_at) of the answers an anytime state counted, in the order it counted them."""
    return store.sql_frame("SELECT question_id, position, counted_at FROM anytime_counted WHERE state_id = ? "
                           "ORDER BY position", [state_id])
