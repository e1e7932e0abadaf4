"""Table layouts shared by every stage: loaders, generation, scoring, labelling, calibration and the store.

Each table is a polars schema plus its natural key. Stages hand each other polars DataFrames with exactly
these columns (`conform` checks and orders them); the DuckDB store creates its tables from the same
definitions, so a column is added in one place. `run_key` identifies one generation run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from cic.errors import UserError


@dataclass(frozen=True)
class TableSpec:
    """A table: its columns in order (polars dtypes), the columns of its natural key, and the columns added
    after the table first shipped (nullable: a batch or an older export may lack them)."""

    name: str
    columns: dict[str, pl.DataType]
    key: tuple[str, ...]
    added_later: tuple[str, ...] = ()

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema(self.columns)


QUESTIONS = TableSpec("questions", {
    "dataset": pl.String(), "split": pl.String(), "question_id": pl.String(), "question": pl.String(),
    "choices": pl.List(pl.String()),         # null for open-ended datasets
    "choice_labels": pl.List(pl.String()),   # e.g. ["A", "B", "C", "D", "E"]; null for open-ended
    "answer": pl.String(),                   # gold option label (multiple choice) or gold answer text
    "aliases": pl.List(pl.String()),         # other accepted answers; empty list when none
}, ("dataset", "split", "question_id"))

RUNS = TableSpec("runs", {
    "run_key": pl.String(), "model": pl.String(), "dataset": pl.String(), "split": pl.String(),
    "prompt_id": pl.String(),
    "generation_config": pl.String(),        # canonical JSON of everything that shaped the generations
    "created_at": pl.Datetime("us", "UTC"),
    "experiment_prefix": pl.String(),        # MLflow prefix of the config the run came from (`cic log` uses it)
    "unanswered": pl.Int64(),                # questions of its sample still without an answer after the last
                                             # answer stage (a served model's lost ones); null before one ran
    "moved_requests": pl.Int64(),            # requests of the last answer stage handed to another replica after
                                             # theirs stopped answering (answered there); null before one ran
}, ("run_key",), added_later=("experiment_prefix", "unanswered", "moved_requests"))

GENERATIONS = TableSpec("generations", {
    "run_key": pl.String(), "question_id": pl.String(),
    "sample_index": pl.Int32(),              # 0 = the most likely (greedy) answer, 1..K = samples
    "text": pl.String(),
    "n_tokens": pl.Int32(),
    "logprob_sum": pl.Float64(),             # sum of token log-probabilities up to the first EOS
    "logprob_mean": pl.Float64(),            # logprob_sum / n_tokens (null when n_tokens = 0)
    "is_greedy": pl.Boolean(),
    "option_probs": pl.List(pl.Float64()),   # multiple choice: probability of each option; else null
    "flags": pl.List(pl.String()),           # e.g. ["empty"], ["prompt_truncated"]; empty list when clean
    "hidden": pl.Binary(),                   # greedy row, `generation.keep_hidden`: float16 states (cic.llm.hidden)
}, ("run_key", "question_id", "sample_index"), added_later=("hidden",))

SCORES = TableSpec("scores", {
    "run_key": pl.String(), "question_id": pl.String(),
    "estimator": pl.String(),                # e.g. "semantic_entropy[embedding:0.9]"
    "value": pl.Float64(),                   # higher = more uncertain
}, ("run_key", "question_id", "estimator"))

LABELS = TableSpec("labels", {
    "run_key": pl.String(), "question_id": pl.String(),
    "criterion": pl.String(),                # e.g. "option_match", "similarity[0.6]"
    "aligned": pl.Boolean(),                 # the answer counts as correct (error = not aligned)
    "value": pl.Float64(),                   # the similarity / match value behind the decision
    "created_at": pl.Datetime("us", "UTC"),  # when the label was first stored: recalibration windows
    "ingest": pl.String(),                   # digest of the last ingest that wrote it (null: not ingested)
}, ("run_key", "question_id", "criterion"), added_later=("ingest",))

CALIBRATIONS = TableSpec("calibrations", {
    "calibration_id": pl.String(),
    "model": pl.String(), "dataset": pl.String(), "estimator": pl.String(), "criterion": pl.String(),
    "alpha": pl.Float64(), "delta": pl.Float64(), "bound": pl.String(), "search": pl.String(),
    "threshold": pl.Float64(),               # null: alpha unattainable
    "bound_value": pl.Float64(), "n_accepted": pl.Int64(), "n_errors": pl.Int64(), "n_cal": pl.Int64(),
    "data_fingerprint": pl.String(),         # hash of the (question_id, score, error) rows used
    "result_json": pl.String(),              # CalibrationResult.to_json()
    "created_at": pl.Datetime("us", "UTC"),
    "run_key": pl.String(),                  # the generation run the (score, error) pairs came from
    "window_from": pl.Datetime("us", "UTC"), # first and last time its pairs were seen (observation, else label)
    "window_to": pl.Datetime("us", "UTC"),
    "kind": pl.String(),                     # "pipeline" (all stored data) or "recalibration" (newest window)
    "groups": pl.Int64(),                    # datasets (streams) of its model certified together, each at
                                             # delta / groups (Bonferroni); null: certified alone at delta
    "plan_json": pl.String(),                # how its pairs are rebuilt and its search re-run from the store
                                             # (window size, pilot split, search arguments): serving re-checks
    # A system gate — several stages (a cascade) or an estimator chosen among K — is a row of this table too: its
    # stages in the list columns below, model, estimator, run_key, threshold and result_json null. A single gate
    # (one model, one estimator: the columns above) has these null.
    "system": pl.String(),                   # the cascade's name, or "<model>:auto" for a model's estimator choice
    "system_kind": pl.String(),              # cascade | estimator (the estimator chosen among K at delta / K)
    "models": pl.List(pl.String()),          # in cost order (the order they are asked in)
    "estimators": pl.List(pl.String()),      # the stored estimator each stage thresholds
    "estimator_rule": pl.String(),           # what the config asked: an estimator's base name, or auto
    "costs": pl.List(pl.Float64()),          # per stage, from the config (null: none given)
    "thresholds": pl.List(pl.Float64()),     # per stage; a null stage never answers; all null: unattainable
    "certified": pl.Boolean(),
    "shares": pl.List(pl.Float64()),         # share of the calibration questions each stage answers
    "cost_per_question": pl.Float64(),       # with the cascade's costs: every stage up to the answering one paid
    "candidates": pl.Int64(),                # K: the estimators tried, each at delta / K (1: named in the config)
    "run_keys": pl.List(pl.String()),        # each stage's generation run, joined on question id
    "question_ids": pl.List(pl.String()),    # the questions it was certified on: re-certified on exactly these
    "guarantee": pl.String(),                # the statement, in words
    "favour": pl.String(),                   # a cascade's favoured model (alone at most of delta), or "scores"
    "prior": pl.String(),                    # an estimator choice's prior from other data: JSON {estimator: value}
}, ("calibration_id",), added_later=("groups", "plan_json", "system", "system_kind", "models", "estimators",
                                     "estimator_rule", "costs", "thresholds", "certified", "shares",
                                     "cost_per_question", "candidates", "run_keys", "question_ids", "guarantee",
                                     "favour", "prior"))

#: the columns a single gate fills (a system gate's are `SYSTEM_GATE_COLUMNS`); the rest of its row is null
SINGLE_GATE_COLUMNS = tuple(CALIBRATIONS.columns)[:list(CALIBRATIONS.columns).index("system")]
#: the columns a system gate fills (the stored `system_calibrations` rows of schema version 4 had exactly these but
#: `favour` and `prior`, `system_kind` named `kind`)
SYSTEM_GATE_COLUMNS = ("calibration_id", "system", "system_kind", "models", "estimators", "estimator_rule", "costs",
                       "dataset", "criterion", "alpha", "delta", "bound", "search", "thresholds", "certified",
                       "bound_value", "n_accepted", "n_errors", "n_cal", "shares", "cost_per_question", "candidates",
                       "run_keys", "question_ids", "data_fingerprint", "guarantee", "created_at", "favour", "prior")

EVALUATIONS = TableSpec("evaluations", {
    "evaluation_id": pl.String(),
    "model": pl.String(), "dataset": pl.String(), "estimator": pl.String(), "criterion": pl.String(),
    "alpha": pl.Float64(), "bound": pl.String(), "search": pl.String(), "delta": pl.Float64(),
    "n_splits": pl.Int64(), "cal_fraction": pl.Float64(), "seed": pl.Int64(),
    "fdr_mean": pl.Float64(), "fdr_std": pl.Float64(), "fdr_above_alpha": pl.Float64(),
    "coverage_mean": pl.Float64(), "coverage_std": pl.Float64(),
    "correct_coverage_mean": pl.Float64(), "correct_coverage_std": pl.Float64(),
    "fails": pl.Int64(), "base_error_rate": pl.Float64(), "threshold_mean": pl.Float64(),
    "threshold_std": pl.Float64(), "n_cal": pl.Int64(), "n_test": pl.Int64(),
    "data_fingerprint": pl.String(),
    "created_at": pl.Datetime("us", "UTC"),
    "score_limit": pl.Float64(),             # the best threshold on this score in-sample covers this much at alpha
    "ceiling": pl.Float64(),                 # any rule's coverage at alpha: (1 - base error) / (1 - alpha)
}, ("evaluation_id", "alpha", "bound", "search"), added_later=("score_limit", "ceiling"))

OBSERVATIONS = TableSpec("observations", {
    "run_key": pl.String(), "question_id": pl.String(),
    "observed_at": pl.Datetime("us", "UTC"), # when production saw the question: recalibration windows by time
    "source": pl.String(),                   # the file it was ingested from
    "created_at": pl.Datetime("us", "UTC"),  # when it was first ingested
    "ingest": pl.String(),                   # digest of the last ingest that wrote it: abandoning another keeps it
}, ("run_key", "question_id"), added_later=("ingest",))

GATE_EVENTS = TableSpec("gate_events", {
    "event_id": pl.String(),
    "calibration_id": pl.String(),
    "state": pl.String(),                    # candidate | live | retired (a gate's state is its newest event's)
    "reason": pl.String(),                   # who or what moved it, in words
    "alerts": pl.List(pl.String()),          # what the recalibration that wrote it found; empty when none
    "created_at": pl.Datetime("us", "UTC"),
    "alert_kinds": pl.List(pl.String()),     # each alert's kind (pipeline `production.alerts.ALERT_KINDS`), in order
    "reason_code": pl.String(),              # what the move means (`serving_state.REASON_CODES`); null: a plain move
    "caused_at": pl.Datetime("us", "UTC"),   # the ingest (its stamp) whose relabel or replace raised this flag
}, ("event_id",), added_later=("alert_kinds", "reason_code", "caused_at"))

LABEL_EVENTS = TableSpec("label_events", {
    "event_id": pl.String(),
    "run_key": pl.String(), "question_id": pl.String(), "criterion": pl.String(),
    "old_aligned": pl.Boolean(), "new_aligned": pl.Boolean(),  # a stored label replaced (`cic ingest --relabel`)
    "source": pl.String(),                   # the file that changed it
    "created_at": pl.Datetime("us", "UTC"),
}, ("event_id",))

RECORD_EVENTS = TableSpec("record_events", {
    "event_id": pl.String(),
    "table_name": pl.String(),               # the stored table whose row changed (questions, generations, ...)
    "run_key": pl.String(), "question_id": pl.String(),  # the record (run_key null for a question's text)
    "field": pl.String(),                    # what changed: question, answer, timestamp, gold, score:<estimator>
    "old_value": pl.String(), "new_value": pl.String(),  # both as text (a stored fact replaced: `--replace`)
    "source": pl.String(),                   # the file that changed it
    "created_at": pl.Datetime("us", "UTC"),
}, ("event_id",))

GATE_MONITOR = TableSpec("gate_monitor", {
    "calibration_id": pl.String(),           # the live gate watched
    "checked_at": pl.Datetime("us", "UTC"),  # the recalibration pass that updated it
    "seen_to": pl.Datetime("us", "UTC"),     # the newest labelled pair counted so far (each pair counts once)
    "nights": pl.Int64(),                    # updates since the gate went live
    "n": pl.Int64(),                         # answered questions since its window, and the errors among them
    "k": pl.Int64(),
    "e_value": pl.Float64(),                 # evidence against "error rate among answered <= alpha"
    "alarm_at": pl.Float64(),                # the e-value that alarms: (live gates monitored) / level
    "rate_lower_bound": pl.Float64(),        # anytime-valid lower confidence bound on that rate
    "alarmed": pl.Boolean(),
    "created_at": pl.Datetime("us", "UTC"),
}, ("calibration_id", "checked_at"))

INGESTS = TableSpec("ingests", {
    "digest": pl.String(),                   # sha256 of the file's bytes: a renamed file is the same ingest
    "file": pl.String(),                     # absolute path it was last ingested from
    "records": pl.Int64(),
    "state": pl.String(),                    # writing | done: recalibration waits while any is writing
    "started_at": pl.Datetime("us", "UTC"),
    "finished_at": pl.Datetime("us", "UTC"),
    "created_at": pl.Datetime("us", "UTC"),
    "plan": pl.String(),                     # its commit steps (kind and rows of each staged file), as JSON
    "committed": pl.Int64(),                 # steps committed so far (in the same transaction as each step)
}, ("digest",), added_later=("plan", "committed"))

GROUP_EVALUATIONS = TableSpec("group_evaluations", {
    "evaluation_id": pl.String(),            # one per (model, estimator, criterion) study over its datasets
    "model": pl.String(), "estimator": pl.String(), "criterion": pl.String(),
    "dataset": pl.String(),                  # the dataset (production stream) judged
    "gate": pl.String(),                     # per_group (each dataset its own gate at delta / G) | pooled
    "alpha": pl.Float64(), "delta": pl.Float64(), "bound": pl.String(), "search": pl.String(),
    "size": pl.Int64(),                      # the group's labelled questions
    "fdr_mean": pl.Float64(),                # test FDR over the splits where the group was served a threshold
    "fdr_above_alpha": pl.Float64(),         # share of those splits whose test FDR exceeded alpha
    "coverage_mean": pl.Float64(), "fails": pl.Int64(), "n_splits": pl.Int64(), "cal_fraction": pl.Float64(),
    "seed": pl.Int64(),
    "created_at": pl.Datetime("us", "UTC"),
}, ("evaluation_id", "dataset", "gate", "alpha", "bound", "search"))

SYSTEM_EVALUATIONS = TableSpec("system_evaluations", {
    "evaluation_id": pl.String(),
    "system": pl.String(), "kind": pl.String(), "models": pl.List(pl.String()),
    "dataset": pl.String(), "criterion": pl.String(),
    "alpha": pl.Float64(), "bound": pl.String(), "search": pl.String(), "delta": pl.Float64(),
    "n_splits": pl.Int64(), "cal_fraction": pl.Float64(), "seed": pl.Int64(),
    "fdr_mean": pl.Float64(), "fdr_std": pl.Float64(), "fdr_above_alpha": pl.Float64(),
    "coverage_mean": pl.Float64(), "coverage_std": pl.Float64(), "fails": pl.Int64(),
    "shares_mean": pl.List(pl.Float64()),    # per stage, the share of test questions it answers
    "candidates": pl.List(pl.String()),      # the estimators tried (each at delta / K) ...
    "chosen_shares": pl.List(pl.Float64()),  # ... and the share of splits that kept each
    "n_cal": pl.Int64(), "n_test": pl.Int64(),
    "data_fingerprint": pl.String(),
    "created_at": pl.Datetime("us", "UTC"),
}, ("evaluation_id", "alpha", "bound", "search"))

ANYTIME_STATES = TableSpec("anytime_states", {
    "state_id": pl.String(),                 # hash of the key and its epoch
    "run_key": pl.String(), "model": pl.String(), "dataset": pl.String(), "estimator": pl.String(),
    "criterion": pl.String(), "alpha": pl.Float64(), "delta": pl.Float64(),
    "groups": pl.Int64(),                    # G datasets certified together: each state at delta / G
    "epoch": pl.Int64(),                     # 0, then +1 each time a monitor alarm restarts the key
    "state_json": pl.String(),               # `cic.stats.anytime.AnytimeState` (grid, wealth, crossings)
    "counted": pl.Int64(),                   # labelled answers counted, each once
    "threshold": pl.Float64(),               # the widest certified threshold (null: none yet)
    "certified_since": pl.Datetime("us", "UTC"),  # the pass that first certified that threshold
    "started_at": pl.Datetime("us", "UTC"),
    "created_at": pl.Datetime("us", "UTC"),  # this pass (the newest row of a state_id is its state)
    # every record seen up to this time is settled: counted (labelled within its label window) or never counted
    "counted_through": pl.Datetime("us", "UTC"),
}, ("state_id", "created_at"), added_later=("counted_through",))

ANYTIME_COUNTED = TableSpec("anytime_counted", {
    "state_id": pl.String(), "question_id": pl.String(),
    "position": pl.Int64(),                  # arrival order: the e-processes saw the answers in this order
    "counted_at": pl.Datetime("us", "UTC"),
}, ("state_id", "question_id"))

LAKE_FILES = TableSpec("lake_files", {
    "table_uri": pl.String(),                # the Delta table as deltalake names it (file:///…, s3://…)
    "path": pl.String(),                     # a data file of it, relative to the table: loaded once, ever
    "version": pl.Int64(),                   # the table version the load read
    "rows": pl.Int64(),
    "purpose": pl.String(),                  # landing (workers' rows) | ingest (production records)
    "loaded_at": pl.Datetime("us", "UTC"),
}, ("table_uri", "path"))

PROBES = TableSpec("probes", {
    "run_key": pl.String(),
    "estimator": pl.String(),                # the name its scores are stored under (cic.llm.probes.Probe.estimator)
    "kind": pl.String(),                     # accuracy (fitted on labels: its fit split is never certified on)
    "target": pl.String(),                   # | semantic_entropy (label-free); target: criterion or estimator
    "fit_digest": pl.String(),
    "fit_ids": pl.List(pl.String()),         # the questions it was fitted on
    "artifact": pl.String(),                 # the probe itself, as JSON (Probe.to_json)
    "created_at": pl.Datetime("us", "UTC"),
}, ("run_key", "estimator"))

TABLES: dict[str, TableSpec] = {t.name: t for t in (QUESTIONS, RUNS, GENERATIONS, SCORES, LABELS, CALIBRATIONS,
                                                     EVALUATIONS, OBSERVATIONS, GATE_EVENTS, LABEL_EVENTS,
                                                     RECORD_EVENTS,
                                                     INGESTS, GATE_MONITOR, GROUP_EVALUATIONS, SYSTEM_EVALUATIONS,
                                                     ANYTIME_STATES, ANYTIME_COUNTED, LAKE_FILES, PROBES)}


JUDGED_JOIN = "+"  # joins a judge's criterion and the people's: the criterion a judge-plus-people gate certifies


def judged_criterion(judge: str, people: str) -> str:
    """The criterion of a gate certified with a judge's labels corrected by people's: `judge+people`."""
    return f"{judge}{JUDGED_JOIN}{people}"


def judged_parts(criterion: str) -> tuple[str, str] | None:
    """(judge, people) of a judge-plus-people criterion (`judged_criterion`); None for one labeller's criterion."""
    judge, sep, people = criterion.partition(JUDGED_JOIN)
    return (judge, people) if sep and judge and people and JUDGED_JOIN not in people else None


def estimator_base(name: str) -> str:
    """An estimator's registry name without the settings a stored score name carries in brackets
    (`semantic_entropy[embedding:0.9]` -> `semantic_entropy`)."""
    return name.split("[", 1)[0]


def estimator_base_column(column: str = "estimator") -> pl.Expr:
    """`estimator_base` of every value of a column."""
    return pl.col(column).str.split("[").list.first()


def conform(frame: pl.DataFrame, spec: TableSpec) -> pl.DataFrame:
    """Select and cast `frame` to the table's columns, in order; a missing column is an error naming it (one the
    table gained later is null)."""
    frame = frame.with_columns(pl.lit(None, dtype=spec.columns[c]).alias(c) for c in spec.added_later
                               if c not in frame.columns)
    missing = [c for c in spec.columns if c not in frame.columns]
    if missing:
        raise UserError(f"{spec.name} rows lack column(s) {', '.join(missing)}; "
                         f"expected {', '.join(spec.columns)}")
    return frame.select([pl.col(c).cast(t) for c, t in spec.columns.items()])


def canonical_json(value: Mapping[str, Any]) -> str:
    """JSON with sorted keys and no whitespace: equal configs give equal strings (and hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def stable_hash(*parts: str, length: int = 16) -> str:
    """A short, stable hex digest of the parts (sha256)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
    return digest[:length]


def value_hash(*parts: Any) -> str:
    """`stable_hash` of arbitrary JSON-able parts (strings as they are, anything else as canonical JSON)."""
    return stable_hash(*(p if isinstance(p, str) else canonical_json(p) for p in parts))


def run_key(model: str, dataset: str, split: str, prompt_id: str, generation_config: Mapping[str, Any]) -> str:
    """The natural key of one generation run: a hash of (model spec, dataset, split, prompt id, config)."""
    return stable_hash(model, dataset, split, prompt_id, canonical_json(generation_config))
