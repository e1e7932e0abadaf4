"""The store's queries for hidden-state probes (`cic.pipeline.run.probe_stage`, `cic ask`, the probe study): the
kept states of a run, its labels and semantic entropy, the probes stored, and the refusal every read of certificate
pairs passes (`refuse_fit_questions`). It imports nothing of the store's other modules (the database calls it)."""

from __future__ import annotations

from typing import Any

import polars as pl

from cic.errors import UserError

_FITTED = ("SELECT run_key, estimator, unnest(fit_ids) AS question_id FROM probes WHERE kind = 'accuracy' AND "
           "run_key IN (SELECT unnest(?)) AND estimator IN (SELECT unnest(?))")


def refuse_fit_questions(store: Any, pairs: pl.DataFrame) -> None:
    """Every read of (score, error) pairs for a certificate passes here: a pair whose score comes from an accuracy
    probe fitted on that very question (`probes.fit_ids`) is refused in one line — a score fitted on the labels
    that certify it voids the guarantee."""
    if pairs.height == 0 or not store.sql_frame("SELECT 1 FROM probes LIMIT 1").height:
        return
    keys = ["run_key", "estimator", "question_id"]
    fitted = store.sql_frame(_FITTED, [pairs.get_column("run_key").unique().to_list(),
                                       pairs.get_column("estimator").unique().to_list()])
    shared = pairs.select(keys).join(fitted, on=keys, how="semi")
    if shared.height:
        first = shared.row(0, named=True)
        raise UserError(f"{first['estimator']}: {shared.height} calibration question(s) the probe was fitted on "
                        f"(first: {first['question_id']} of run {first['run_key']}); a score fitted on the labels "
                        "that certify it voids the guarantee — certify on questions outside its fit split")


def kept_states(store: Any, run_key: str) -> pl.DataFrame:
    """(question_id, hidden) of the run's greedy rows that kept states, by question id."""
    return store.sql_frame("SELECT question_id, hidden FROM generations WHERE run_key = ? AND sample_index = 0 AND "
                           "hidden IS NOT NULL ORDER BY question_id", [run_key])


def run_errors(store: Any, run_key: str) -> pl.DataFrame:
    """(question_id, criterion, error) of every label of the run."""
    return store.sql_frame("SELECT question_id, criterion, CAST(NOT aligned AS INT) AS error FROM labels WHERE "
                           "run_key = ?", [run_key])


def scores_named(store: Any, run_key: str, prefix: str) -> pl.DataFrame:
    """(question_id, estimator, value) of the run's non-null scores whose estimator is `prefix` or `prefix[...]`."""
    return store.sql_frame("SELECT question_id, estimator, value FROM scores WHERE run_key = ? AND value IS NOT "
                           "NULL AND (estimator = ? OR estimator LIKE ?)", [run_key, prefix, prefix + "[%"])


def probe_artifact(store: Any, run_key: str, estimator: str) -> str | None:
    """The stored probe (JSON) whose scores are stored under `estimator` in this run, or None."""
    found = store.sql_frame("SELECT artifact FROM probes WHERE run_key = ? AND estimator = ?", [run_key, estimator])
    return found.get_column("artifact")[0] if found.height else None
