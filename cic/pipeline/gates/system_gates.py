"""Gates for a system, from what the store holds: the config's cascades and each model's estimator chosen (`auto`).

For each cascade (or model with `calibration.estimator: auto`), dataset and criterion the stages' stored
(score, error) pairs are joined on question id (a question missing from any stage is left out), the system is
certified on all of them per (alpha, bound) with the default search (`cic.stats.cascades`: one family-wise
guarantee for the whole system), and the split protocol measures it on the same pairs. Rows fit the
`calibrations` table (a system gate's columns: `schema.SYSTEM_GATE_COLUMNS`) and the `system_evaluations` table,
keyed by hashes of everything that shaped them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.gates.event_log import HOLDS_KEY, current_states
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow
from cic.pipeline.run.run_results import SystemResultRow
from cic.pipeline.run.stored_calibration import data_fingerprint, settled
from cic.stats.cascades import FAVOUR_SHARE, certify_system, evaluate_system_splits, shares_clause
from cic.stats.estimator_prior import prior_shares
from cic.stats.searches import DEFAULT_SEARCH
from cic.store.queries import (
    labelled_criteria,
    labelled_pairs_of_runs,
    past_coverage,
    scored_estimators,
    system_gate_frame,
)

if TYPE_CHECKING:
    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.run.run_results import CalibrateStats
    from cic.store import Store


@dataclass(frozen=True)
class SystemSpec:
    """A system to certify: a cascade of models, or one model whose estimator is chosen (`kind` estimator)."""

    name: str
    kind: str  # cascade | estimator
    models: tuple[str, ...]
    estimator: str  # an estimator's base name, or "auto"
    costs: tuple[float, ...] | None = None
    favour: str | None = None  # a cascade's favoured model, or "scores" (`cic.stats.cascades.favourite`)
    prior: str | None = None  # an estimator choice's prior from other data, JSON {estimator: value} (None: uniform)


@dataclass(frozen=True)
class SystemData:
    """One system on one dataset and criterion: per candidate estimator (stored name), each stage's scores and
    errors on the questions every stage answered, in question order."""

    spec: SystemSpec
    dataset: str
    criterion: str
    run_keys: tuple[str, ...]
    tables: dict[str, tuple[list[Any], list[Any]]]
    fingerprint: str
    question_ids: list[str]


def calibrate_systems(store: Store, run_keys: list[str], config: CalibrationConfig, stats: CalibrateStats, *,
                      promote_first: Callable[..., list[str]]) -> None:
    """Certify and evaluate every system the config names on these runs and store the rows (idempotent upserts),
    each key's first gate made live by `promote_first` (the lifecycle's) in the same transaction; counts go to
    `stats`."""
    from cic.pipeline.run import progress

    models = sorted(set(store.read("runs", run_key=run_keys).get_column("model").to_list()))
    specs = system_specs(config, models)
    for done, spec in enumerate(specs, 1):
        for found in iter_system_data(store, run_keys, spec):
            data = with_prior(store, found, config)
            calibrations = system_calibration_rows(data, config)
            evaluations = system_evaluation_rows(data, config)
            with store.transaction():
                store.upsert("calibrations", calibrations)
                store.upsert("system_evaluations", evaluations)
                made = promote_first(store, calibrations.get_column("calibration_id").to_list(),
                                     reason="pipeline: the first gate of its key")
            stats.promoted += len(made)
            stats.systems += 1
            stats.system_gates += calibrations.height
            stats.system_unattainable += int((~calibrations.get_column("certified")).sum())
        progress.report("calibrate systems", done, len(specs))


def system_specs(config: CalibrationConfig, models: list[str]) -> list[SystemSpec]:
    """The config's cascades, then one estimator choice per model when `estimator` is auto."""
    specs = [SystemSpec(c.name, "cascade", c.models, c.estimator, c.costs, c.favour) for c in config.cascades]
    if config.estimator == "auto":
        specs += [SystemSpec(f"{m}:auto", "estimator", (m,), "auto") for m in models]
    return specs


def iter_system_data(store: Store, run_keys: list[str], spec: SystemSpec, only: list[str] | None = None,
                     through: datetime | None = None, skip: Collection[tuple[str, str]] = ()
                     ) -> Iterator[SystemData]:
    """Every (dataset, criterion) on which each of the system's models has a run among `run_keys` (`only`: on
    these questions alone, as a stored gate was certified; `through`: on those whose label window has closed —
    seen in every stage by then; `skip`: (dataset, criterion) pairs not wanted, never joined)."""
    runs = store.read("runs", run_key=run_keys)
    for (dataset,), group in runs.sort("dataset").group_by("dataset", maintain_order=True):
        by_model = {r["model"]: r["run_key"] for r in group.iter_rows(named=True)}
        if not all(m in by_model for m in spec.models):
            continue
        keys = tuple(by_model[m] for m in spec.models)
        criteria = set.intersection(*(set(labelled_criteria(store, k)) for k in keys))
        shared = set.intersection(*(set(scored_estimators(store, k)) for k in keys))
        estimators = sorted(e for e in shared if spec.estimator == "auto" or schema.estimator_base(e) == spec.estimator)
        for criterion in sorted(c for c in criteria if (str(dataset), c) not in skip):
            data = _joined(store, spec, str(dataset), criterion, keys, estimators, only, through)
            if data is not None:
                yield data


def _joined(store: Store, spec: SystemSpec, dataset: str, criterion: str, keys: tuple[str, ...],
            estimators: list[str], only: list[str] | None = None, through: datetime | None = None
            ) -> SystemData | None:
    """Every candidate estimator's stage pairs on the questions all stages (and all candidates) hold."""
    frames = []
    for estimator in estimators:
        for stage, (model, key) in enumerate(zip(spec.models, keys, strict=True)):
            pairs = store.calibration_frame(model, dataset, estimator, criterion, run_key=key, allow_partial=True)
            frames.append(pairs.select("question_id", pl.col("score").alias(f"s|{estimator}|{stage}"),
                                       pl.col("error").alias(f"e|{estimator}|{stage}")))
    if not frames:
        return None
    joined = frames[0]
    for frame in frames[1:]:
        joined = joined.join(frame, on="question_id", how="inner")
    if only is not None:
        joined = joined.filter(pl.col("question_id").is_in(only))
    if through is not None:
        ready = settled(question_times(store, keys, criterion), through).get_column("question_id")
        joined = joined.filter(pl.col("question_id").is_in(ready.implode()))
    joined = joined.sort("question_id")
    if joined.height < 2:
        return None
    stages = range(len(spec.models))
    tables = {e: ([joined.get_column(f"s|{e}|{i}").to_numpy() for i in stages],
                  [joined.get_column(f"e|{e}|{i}").to_numpy() for i in stages]) for e in estimators}
    fingerprint = schema.value_hash(*(data_fingerprint(joined.select(
        "question_id", pl.col(f"s|{e}|{i}").alias("score"), pl.col(f"e|{e}|{i}").alias("error")))
        for e in estimators for i in stages))
    return SystemData(spec, dataset, criterion, keys, tables, fingerprint,
                      joined.get_column("question_id").to_list())


def question_times(store: Store, run_keys: Sequence[str], criterion: str) -> pl.DataFrame:
    """(question_id, at) of the questions labelled for `criterion` in every stage's run, `at` the latest stage's
    time (when the system's answer was whole), oldest first."""
    frames = []
    for i, run_key in enumerate(run_keys):
        pairs = labelled_pairs_of_runs(store, [run_key], criterion=criterion)
        frames.append(pairs.group_by("question_id").agg(pl.col("at").max().alias(f"at{i}")))
    joined = frames[0]
    for frame in frames[1:]:
        joined = joined.join(frame, on="question_id", how="inner")
    return joined.select("question_id", pl.max_horizontal(*(f"at{i}" for i in range(len(frames)))).alias("at")) \
        .sort("at", "question_id")


def system_calibration_rows(data: SystemData, config: CalibrationConfig) -> pl.DataFrame:
    """One `calibrations` row per (alpha, bound): the system certified on all its joined pairs, each
    candidate estimator at delta / K, or at its share under the spec's prior (`cic.stats.estimator_prior`)."""
    spec, k = data.spec, len(data.tables)
    prior = json.loads(spec.prior) if spec.prior else None
    shares = prior_shares(list(data.tables), prior, config.delta)
    rows = []
    for alpha in config.alphas:
        for bound in config.bounds:
            choice = certify_system(data.tables, alpha=alpha, delta=config.delta, bound=bound,
                                    search=DEFAULT_SEARCH, models=spec.models, costs=spec.costs, favour=spec.favour,
                                    shares=shares)
            result, kept = choice.result, choice.estimator is not None
            favoured = (spec.favour,) if spec.favour is not None else ()  # ids of unfavoured gates as they were
            ranked = (spec.prior,) if spec.prior is not None else ()  # and of choices without a prior
            rows.append({
                "calibration_id": schema.value_hash("system", spec.name, spec.kind, spec.models, spec.estimator,
                                                    spec.costs, data.dataset, data.criterion, alpha, config.delta,
                                                    bound, DEFAULT_SEARCH, data.fingerprint, *favoured, *ranked),
                "favour": spec.favour, "prior": spec.prior,
                "system": spec.name, "system_kind": spec.kind, "models": list(spec.models),
                "estimators": [choice.estimator] * len(spec.models) if kept else [],
                "estimator_rule": spec.estimator, "costs": list(spec.costs) if spec.costs is not None else None,
                "dataset": data.dataset, "criterion": data.criterion, "alpha": alpha, "delta": config.delta,
                "bound": bound, "search": DEFAULT_SEARCH, "thresholds": list(choice.thresholds), "certified": kept,
                "bound_value": result.bound_value if kept else None,
                "n_accepted": result.n_accepted if kept else 0, "n_errors": result.n_errors if kept else 0,
                "n_cal": result.n_calibration, "shares": list(choice.shares),
                "cost_per_question": getattr(result, "cost_per_question", None) if kept else None,
                "candidates": k, "run_keys": list(data.run_keys), "question_ids": data.question_ids,
                "data_fingerprint": data.fingerprint,
                "guarantee": _guarantee(spec, k, alpha, config.delta, shares, prior),
                "created_at": datetime.now(UTC)})
    return schema.conform(pl.DataFrame(rows, schema=schema.CALIBRATIONS.schema), schema.CALIBRATIONS)


def _guarantee(spec: SystemSpec, k: int, alpha: float, delta: float, shares: dict[str, float],
               prior: dict[str, float] | None) -> str:
    favoured = (f"; {spec.favour if spec.favour != 'scores' else 'the model with the lowest median score'} alone "
                f"at {FAVOUR_SHARE:g} of delta" if spec.favour is not None else "")
    what = (f"the {len(spec.models)}-model cascade {' -> '.join(spec.models)} (thresholds along label-free paths "
            f"of score quantiles{favoured})" if spec.kind == "cascade" else f"{spec.models[0]}'s gate")
    tried = f"delta / {k}" if not prior else shares_clause(shares, delta, prior)  # uniform: the words gates kept
    return (f"P(error among answered <= {alpha:g}) >= {1 - delta:g} for {what}, {k} estimator(s) tried at {tried} "
            f"and the one answering the most kept; {DEFAULT_SEARCH} search; exchangeable questions")


def with_prior(store: Store, data: SystemData, config: CalibrationConfig) -> SystemData:
    """An estimator choice with `calibration.estimator_prior: other_datasets` gets its prior: each candidate's mean
    certified coverage in the model's stored gates on its *other* datasets (`cic.store.queries.past_coverage`) —
    questions not among these, so the shares are fixed before these labels are read; none there: unchanged."""
    if data.spec.kind != "estimator" or config.estimator_prior != "other_datasets" or data.spec.prior is not None:
        return data
    past = past_coverage(store, data.spec.models[0], data.dataset, data.criterion, list(data.tables), DEFAULT_SEARCH)
    return replace(data, spec=replace(data.spec, prior=schema.canonical_json(past))) if past else data


def system_evaluation_rows(data: SystemData, config: CalibrationConfig) -> pl.DataFrame:
    """The split protocol for the system (`cic.stats.cascades.evaluate_system_splits`): one `system_evaluations`
    row per (alpha, bound)."""
    spec = data.spec
    rows = evaluate_system_splits(data.tables, alphas=config.alphas, bounds=config.bounds, delta=config.delta,
                                  search=DEFAULT_SEARCH, n_splits=config.n_splits, cal_fraction=config.cal_fraction,
                                  seed=config.seed, costs=spec.costs)
    evaluation_id = schema.value_hash("system", spec.name, spec.kind, spec.models, spec.estimator, spec.costs,
                                      data.dataset, data.criterion, data.fingerprint, config.delta, config.n_splits,
                                      config.cal_fraction, config.seed)
    now = datetime.now(UTC)
    frame = pl.DataFrame([{**row, "evaluation_id": evaluation_id, "system": spec.name, "kind": spec.kind,
                           "models": list(spec.models), "candidates": list(data.tables), "dataset": data.dataset,
                           "criterion": data.criterion, "cal_fraction": config.cal_fraction, "seed": config.seed,
                           "data_fingerprint": data.fingerprint, "created_at": now} for row in rows])
    return schema.conform(frame, schema.SYSTEM_EVALUATIONS)


def system_results(store: Store, run_keys: list[str]) -> list[SystemResultRow]:
    """Every stored system gate over these runs with its split protocol (the newest of each key), for display."""
    wanted = set(run_keys)
    gates = stored_system_rows(store)
    gates = gates.filter(pl.col("run_keys").list.eval(pl.element().is_in(list(wanted))).list.all())
    if gates.is_empty():
        return []
    key = ["system", "dataset", "criterion", "alpha", "bound", "search"]
    gates = gates.sort("created_at").unique(subset=key, keep="last")
    protocol = store.read("system_evaluations").sort("created_at").unique(subset=[*key, "data_fingerprint"],
                                                                           keep="last")
    joined = gates.join(protocol.select(*key, "data_fingerprint", "fdr_mean", "fdr_above_alpha", "coverage_mean",
                                        "shares_mean", "fails", "n_splits"),
                        on=[*key, "data_fingerprint"], how="left").sort("system", "dataset", "criterion", "alpha",
                                                                         "bound")
    return [SystemResultRow(r["system"], r["system_kind"], tuple(r["models"]), r["dataset"], r["criterion"], r["alpha"],
                            r["bound"], r["search"], tuple(r["estimators"] or ()), tuple(r["thresholds"]),
                            tuple(r["shares"]), r["fdr_mean"], r["fdr_above_alpha"], r["coverage_mean"],
                            tuple(r["shares_mean"] or ()), r["fails"], r["n_splits"])
            for r in joined.iter_rows(named=True)]


def spec_of(row: GateRow) -> SystemSpec:
    """The system a stored gate was certified for, from its own row (no config needed to re-certify it)."""
    costs = row.get("costs")
    return SystemSpec(row["system"], row["system_kind"], tuple(row["models"]), row["estimator_rule"],
                      tuple(costs) if costs is not None else None, row.get("favour"), row.get("prior"))


#: every column of a stored system gate that a serving surface serves or states: each is re-certified
SERVED_COLUMNS = tuple(c for c in schema.SYSTEM_GATE_COLUMNS if c != "created_at")


def recertify_system(store: Store, row: GateRow) -> None:
    """Re-certify a stored system gate from the store's pairs on the questions it was certified on: an error unless
    the same data and system give the same gate in every served column (`SERVED_COLUMNS`: id, estimators per
    stage, thresholds, counts, bound, search, guarantee, runs, …) — a gate whose data changed (a label replaced)
    or whose row was edited never serves; labels of new questions since do not touch it. Export, `cic ask
    --cascade`, promotion and the registry all call this one check."""
    from cic.pipeline.config import CalibrationConfig

    spec = spec_of(row)
    name = (f"system gate {row['calibration_id'][:12]} ({row['system']}, {row['dataset']}, alpha={row['alpha']:g}, "
            f"{row['bound']})")
    try:
        one = CalibrationConfig(alphas=(row["alpha"],), bounds=(row["bound"],), delta=row["delta"])
        data = next((d for d in iter_system_data(store, row["run_keys"], spec, only=row["question_ids"])
                     if d.dataset == row["dataset"] and d.criterion == row["criterion"]), None)
    except (UserError, ValueError, TypeError) as exc:
        raise UserError(f"{name}: it cannot be re-certified ({exc}); refusing to serve it") from None
    rebuilt = 0 if data is None else len(data.question_ids)
    if data is None or data.fingerprint != row["data_fingerprint"]:  # in a single gate's words (`certificates`)
        raise UserError(f"{name}: its calibration pairs are no longer in the store ({rebuilt} of its "
                        f"{len(row['question_ids'])} questions rebuilt in every stage; their fingerprint differs); "
                        "refusing to serve it (recalibrate to replace it)")
    again = system_calibration_rows(data, one).row(0, named=True)
    for column in SERVED_COLUMNS:
        if not _same(row.get(column), again.get(column)):
            raise UserError(f"{name}: column {column} = {row.get(column)!r}, but re-certifying it from the store "
                            f"gives {again.get(column)!r} (the row was edited); refusing to serve it (recalibrate "
                            "to replace it)")


def _same(stored: Any, certified: Any) -> bool:
    """Equal, floats to 1e-12 relative (a stored float may round-trip), lists element by element."""
    if isinstance(stored, float) and isinstance(certified, float):
        return math.isclose(stored, certified, rel_tol=1e-12, abs_tol=1e-300)
    if isinstance(stored, list | tuple) and isinstance(certified, list | tuple):
        return len(stored) == len(certified) and all(_same(a, b) for a, b in zip(stored, certified, strict=True))
    return bool(stored == certified)


SYSTEM_KEY = ("system", "dataset", "criterion", "alpha", "bound", "search")
#: how a served system gate routes a question (the export's and the registry's words)
ROUTE = ("ask the models in order; the first whose score is <= its threshold answers (a null threshold: that model "
         "never answers); none: abstain")


def stored_system_rows(store: Store) -> pl.DataFrame:
    """The stored system gates: the `calibrations` rows with a system, in their columns (`SYSTEM_GATE_COLUMNS`)."""
    return system_gate_frame(store)


def system_gates(store: Store, **equals: Any) -> pl.DataFrame:
    """Stored system gates (filtered by column equality) with their state from the gate event log, as single gates
    have theirs (`cic.pipeline.gates.lifecycle`): no event = candidate."""

    rows = stored_system_rows(store)
    for column, value in equals.items():
        rows = rows.filter(pl.col(column) == value)
    return rows.join(current_states(store), on="calibration_id", how="left").with_columns(
        pl.col("state").fill_null("candidate"))


def system_key(row: ColumnReader) -> tuple[Any, ...]:
    """The key one system gate speaks for: system, dataset, criterion, alpha, bound, search and delta."""
    return (*(round(float(row[c]), 12) if c == "alpha" else row[c] for c in SYSTEM_KEY), round(float(row["delta"]), 12))


def speaking_system_gates(store: Store, **equals: Any) -> pl.DataFrame:
    """Per system key the gate that speaks for it: live, or unattainable (serves nothing)."""

    rows = system_gates(store, **equals).filter(pl.col("state").is_in(HOLDS_KEY))
    return rows.sort("state_at").unique(subset=list(SYSTEM_KEY), keep="last").sort(*SYSTEM_KEY)
