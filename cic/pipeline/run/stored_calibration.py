"""Calibrate and evaluate what the store holds: one group per (run, estimator, criterion).

For each group the (score, error) pairs come from the store's scores and labels (`labelled_pairs`: a scored question
whose label is missing counts as an error unless `calibration.missing_labels: at_random`); the gate is calibrated on
all of them for every (alpha, bound, search), and the paper's split protocol runs on the same pairs. The rows
returned fit the `calibrations` and `evaluations` tables, keyed by hashes of everything that shaped them, so
recomputing identical work rewrites identical keys (no duplicates).

The Bonferroni grid must be fixed before the labels are seen: `grid.kind = "pilot_quantiles"` sets aside a
seeded pilot share of the group, takes score quantiles from it and calibrates/evaluates on the rest only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from cic import schema
from cic.errors import UserError
from cic.stats.calibration import calibrate, calibrate_judged, quantile_grid, uniform_grid
from cic.stats.protocol import evaluate_splits
from cic.stats.searches import Search
from cic.store.queries import labelled_criteria, labelled_pairs_of_runs, scored_estimators

if TYPE_CHECKING:
    from cic.pipeline.config import CalibrationConfig, JudgedConfig
    from cic.store import Store


@dataclass(frozen=True)
class GroupKey:
    """One calibration group: a stored run with an estimator and a criterion."""

    run_key: str
    model: str
    dataset: str
    estimator: str
    criterion: str

    def as_dict(self) -> dict[str, str]:
        return {"run_key": self.run_key, "model": self.model, "dataset": self.dataset,
                "estimator": self.estimator, "criterion": self.criterion}


def data_fingerprint(pairs: pl.DataFrame) -> str:
    """A hash of the (question_id, score, error) rows — and the people's verdicts of a judge-plus-people group:
    equal data, equal fingerprint."""
    ordered = pairs.sort("question_id")
    people = (ordered.get_column("human").to_list(),) if "human" in ordered.columns else ()
    return schema.value_hash(ordered.get_column("question_id").to_list(),
                              np.round(ordered.get_column("score").to_numpy(), 12).tolist(),
                              ordered.get_column("error").to_list(), *people)


def pair_columns(pairs: pl.DataFrame) -> list[str]:
    """The columns a certificate reads: (question_id, score, error), and `human` in a judge-plus-people group."""
    return ["question_id", "score", "error", *(["human"] if "human" in pairs.columns else [])]


def truth_of(pairs: pl.DataFrame) -> pl.DataFrame:
    """The pairs as the certified criterion labels them: in a judge-plus-people group the questions people
    labelled, with their verdict as the error (what limits, drift tests and monitors read); else unchanged."""
    if "human" not in pairs.columns:
        return pairs
    return pairs.filter(pl.col("human").is_not_null()).with_columns(error=pl.col("human").cast(pl.Int8))


def stored_run_keys(store: Store, models: Sequence[str], datasets: Sequence[str]) -> list[str]:
    """Run keys of the given models on the given datasets; an error when there are none."""
    keys = store.read("runs", model=list(models), dataset=list(datasets)).get_column("run_key").to_list()
    if not keys:
        raise UserError(f"db = {str(store.path)!r} holds no runs of models {list(models)} on datasets "
                         f"{list(datasets)}; run `cic run` first")
    return keys


def groups_of_run(store: Store, run: dict[str, Any], estimators: Sequence[str] | None = None,
                  criteria: Sequence[str] | None = None, judged: Sequence[JudgedConfig] = ()) -> list[GroupKey]:
    """The (estimator, criterion) groups a run can calibrate: estimators with at least two non-null scores,
    criteria with labels; optionally only those whose base name is in `estimators` / listed in `criteria`. Each
    of `judged` whose two criteria the run has labels for adds a `judge+people` group."""
    key = run["run_key"]
    names = [e for e in scored_estimators(store, key) if estimators is None or schema.estimator_base(e) in estimators]
    labelled = labelled_criteria(store, key)
    crits = [c for c in labelled if criteria is None or c in criteria]
    crits += [j.criterion for j in judged if j.judge in labelled and j.people in labelled
              and (criteria is None or j.criterion in criteria or {j.judge, j.people} <= set(criteria))]
    return [GroupKey(key, run["model"], run["dataset"], e, c) for e in names for c in crits if _pairs_with(e, c)]


def _pairs_with(estimator: str, criterion: str) -> bool:
    """An accuracy probe is certified on the criterion it was fitted to predict; every other score on all."""
    from cic.llm.probes import parse_estimator

    probe = parse_estimator(estimator)
    return probe is None or probe[0] != "accuracy" or probe[1] == criterion


def _pilot_split(pairs: pl.DataFrame, fraction: float, seed: int) -> tuple[pl.DataFrame, np.ndarray]:
    """Set aside a seeded pilot share; returns (the rest, the pilot's scores)."""
    rng = np.random.default_rng([seed, 7919])
    order = rng.permutation(pairs.height)
    n_pilot = max(1, int(round(fraction * pairs.height)))
    pilot = pairs[order[:n_pilot].tolist()]
    return pairs[np.sort(order[n_pilot:]).tolist()], pilot.get_column("score").to_numpy()


def pilot_of(search: Search, config: CalibrationConfig) -> dict[str, Any] | None:
    """The seeded pilot split a search's grid comes from ({fraction, seed}), or None when it uses all pairs."""
    if search.needs_grid and config.grid.kind == "pilot_quantiles":
        return {"fraction": config.grid.pilot_fraction, "seed": config.seed}
    return None


def pilot_split(pairs: pl.DataFrame, pilot: dict[str, Any] | None) -> tuple[pl.DataFrame, np.ndarray | None]:
    """(the pairs a search calibrates on, the pilot's scores): the split is seeded on pairs in question order."""
    if pilot is None:
        return pairs, None
    return _pilot_split(pairs.sort("question_id"), pilot["fraction"], pilot["seed"])


def search_plan(pairs: pl.DataFrame, plan: Search, config: CalibrationConfig) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The pairs a search calibrates on and its extra arguments (a grid fixed in advance, n_min)."""
    if plan.needs_grid:
        grid_config = config.grid
        if grid_config.kind == "uniform":
            return pairs, {"grid": uniform_grid(grid_config.low, grid_config.high, grid_config.k)}
        rest, pilot = pilot_split(pairs, pilot_of(plan, config))
        return rest, {"grid": quantile_grid(pilot, grid_config.k)}
    if plan.first_test and config.n_min is not None:
        return pairs, {"n_min": config.n_min}
    return pairs, {}


def group_counts(runs: Iterable[dict[str, Any]], config: CalibrationConfig) -> dict[str, int]:
    """G per model: how many of its datasets (streams) among `runs` are certified together (`group_by:
    dataset`), each at delta / G; 1 for every model otherwise. Counting every run of the model, also one with
    too few pairs to calibrate, only makes each share smaller: still valid."""
    datasets: dict[str, set[str]] = {}
    for run in runs:
        datasets.setdefault(run["model"], set()).add(run["dataset"])
    return {model: len(names) if config.group_by == "dataset" else 1 for model, names in datasets.items()}


def calibration_rows(key: GroupKey, pairs: pl.DataFrame, config: CalibrationConfig, *, kind: str = "pipeline",
                     window: tuple[datetime | None, datetime | None] = (None, None), groups: int = 1,
                     now: datetime | None = None) -> pl.DataFrame:
    """One `calibrations` row per (alpha, bound, search): the deployable gate on all the group's pairs. With
    `groups` G > 1 the gate is one of G certified together: at delta / G (the row keeps the family's delta).
    `now`: when the gate is made (default the wall clock; a pass passes its own clock), the time a re-check
    rebuilds its pairs as of (labels stored later were not among them)."""
    fingerprint = data_fingerprint(pairs)
    share = config.delta / groups
    together = (groups,) if groups > 1 else ()  # ids of gates certified alone stay what they always were
    rows = []
    for plan, alpha, bound, extra, result in _certificates(key, pairs, config, share):
        search = plan.name
        rows.append({
            "calibration_id": schema.value_hash(kind, key.run_key, key.estimator, key.criterion, alpha,
                                                 config.delta, bound, search, fingerprint,
                                                 schema.canonical_json(extra_json(extra)), *together),
            **{k: v for k, v in key.as_dict().items() if k != "run_key"},
            "alpha": alpha, "delta": config.delta, "bound": bound, "search": search,
            "threshold": result.threshold, "bound_value": result.bound_value,
            "n_accepted": result.n_accepted, "n_errors": result.n_errors, "n_cal": result.n_calibration,
            "data_fingerprint": fingerprint, "result_json": result.to_json(indent=None),
            "created_at": now or datetime.now(UTC), "run_key": key.run_key, "window_from": window[0],
            "window_to": window[1], "kind": kind, "groups": groups if groups > 1 else None,
            "plan_json": schema.canonical_json({"window": pairs.height, "pilot": pilot_of(plan, config),
                                                "args": extra_json(extra),
                                                "missing_labels": config.label_policy(key.criterion)}),
        })
    return schema.conform(pl.DataFrame(rows, schema=schema.CALIBRATIONS.schema), schema.CALIBRATIONS)


def _certificates(key: GroupKey, pairs: pl.DataFrame, config: CalibrationConfig, share: float
                  ) -> Iterator[tuple[Search, float, str, dict[str, Any], Any]]:
    """(search, alpha, bound, search arguments, result) of each gate a group gets at level `share`: one
    per (search, alpha, bound); in a judge-plus-people group one per (search, alpha) with the prediction-powered
    tests (`cic.calibrate_judged`; bound "cp"), for the searches that run on them (no grid, high probability)."""
    for plan in config.plans:
        used, extra = search_plan(pairs, plan, config)
        scores, errors = used.get_column("score").to_numpy(), used.get_column("error").to_numpy()
        for alpha in config.alphas:
            if "human" not in used.columns:
                for bound in config.bounds:
                    yield plan, alpha, bound, extra, calibrate(scores, errors, alpha=alpha, delta=share, bound=bound,
                                                               search=plan, **extra)
            elif judges(plan):
                judged = {**extra, "judge_share": config.judge_share(key.criterion)}
                yield plan, alpha, "cp", judged, calibrate_judged(
                    scores, errors, used.get_column("human").to_numpy(), alpha=alpha, delta=share, search=plan,
                    ids=used.get_column("question_id").to_list(), **judged)


def judges(plan: Search) -> bool:
    """Whether a search runs on judge-plus-people tests: no grid, a high-probability guarantee."""
    return not plan.needs_grid and plan.guarantee_kind == "high-probability"


def extra_json(extra: dict[str, Any]) -> dict[str, Any]:
    """Search arguments as JSON-able values (grids as lists)."""
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in extra.items()}


def evaluation_rows(key: GroupKey, pairs: pl.DataFrame, config: CalibrationConfig) -> pl.DataFrame:
    """The split protocol on the group's pairs: one `evaluations` row per (alpha, bound, search)."""
    fingerprint = data_fingerprint(pairs)
    parts = []
    for plan in config.plans:
        used, extra = search_plan(pairs, plan, config)
        table = evaluate_splits(used.get_column("score").to_numpy(), used.get_column("error").to_numpy(),
                                alphas=config.alphas, bounds=config.bounds, search=plan, delta=config.delta,
                                n_splits=config.n_splits, cal_fraction=config.cal_fraction, seed=config.seed,
                                **extra)
        evaluation_id = schema.value_hash(key.run_key, key.estimator, key.criterion, fingerprint, config.delta,
                                           config.n_splits, config.cal_fraction, config.seed,
                                           schema.canonical_json(extra_json(extra)))
        parts.append(table.with_columns(
            evaluation_id=pl.lit(evaluation_id), model=pl.lit(key.model), dataset=pl.lit(key.dataset),
            estimator=pl.lit(key.estimator), criterion=pl.lit(key.criterion), cal_fraction=pl.lit(config.cal_fraction),
            seed=pl.lit(config.seed), data_fingerprint=pl.lit(fingerprint),
            created_at=pl.lit(datetime.now(UTC), dtype=pl.Datetime("us", "UTC"))))
    return schema.conform(pl.concat(parts, how="diagonal_relaxed"), schema.EVALUATIONS)


def group_evaluation_rows(parts: Sequence[tuple[GroupKey, pl.DataFrame]], config: CalibrationConfig) -> pl.DataFrame:
    """The split protocol per dataset for one (model, estimator, criterion) over its datasets' pairs: per-dataset
    gates certified at once (each at delta / G) beside the pooled gate, each judged on every dataset's test part
    (`cic.stats.groups.evaluate_group_splits`), with the first search and every bound. One
    `group_evaluations` row per (alpha, bound, dataset, gate)."""
    from cic.stats.groups import evaluate_group_splits

    first = parts[0][0]
    pooled = pl.concat([pairs.select("question_id", "score", "error").with_columns(group=pl.lit(key.dataset))
                        for key, pairs in parts])
    plan = config.plans[0]
    search = plan.name
    used, extra = search_plan(pooled, plan, config)
    evaluation_id = schema.value_hash("group", first.model, first.estimator, first.criterion,
                                      sorted((key.dataset, data_fingerprint(pairs)) for key, pairs in parts),
                                      config.delta, config.n_splits, config.cal_fraction, config.seed, search,
                                      schema.canonical_json(extra_json(extra)))
    rows, now = [], datetime.now(UTC)  # one time per study: its rows are found together
    for bound in config.bounds:
        for row in evaluate_group_splits(used.get_column("score").to_numpy(), used.get_column("error").to_numpy(),
                                         used.get_column("group").to_numpy(), alphas=config.alphas,
                                         delta=config.delta, bound=bound, search=plan, n_splits=config.n_splits,
                                         cal_fraction=config.cal_fraction, seed=config.seed, **extra):
            rows.append({**_dataset_named(row), "evaluation_id": evaluation_id, "model": first.model,
                         "estimator": first.estimator, "criterion": first.criterion, "delta": config.delta,
                         "bound": bound, "search": search, "cal_fraction": config.cal_fraction, "seed": config.seed,
                         "created_at": now})
    return schema.conform(pl.DataFrame(rows), schema.GROUP_EVALUATIONS)


def _dataset_named(row: dict[str, Any]) -> dict[str, Any]:
    """A per-group row with its group called what it is here: the dataset."""
    return {("dataset" if k == "group" else k): v for k, v in row.items()}


def iter_group_pairs(store: Store, groups: Sequence[GroupKey], policy: str | None | Callable[[str], str | None] = None
                     ) -> Iterator[tuple[GroupKey, pl.DataFrame]]:
    """(group, its (question_id, score, error, at) pairs in question order) for groups with at least two; a scored
    question without a label counts as an error under `missing_labels: worst_case` (`policy`), else is left
    out (`policy` may be chosen per criterion); a label without a score is always left out."""
    for key in groups:
        pairs = labelled_pairs(store, key, policy(key.criterion) if callable(policy) else policy).sort("question_id")
        if pairs.height >= 2:
            yield key, pairs


def labelled_pairs(store: Store, key: GroupKey, policy: str | None = None) -> pl.DataFrame:
    """(question_id, score, error, at) of a group, oldest first; `at` is when production saw the question
    (ingested records) or when its label was stored; scored records without a label as errors under
    `missing_labels: worst_case` (`policy`; seen when observed, else when the run was made)."""
    from cic.pipeline.run.missing_labels import keeps_missing
    from cic.store.queries import judged_pairs_of_runs

    parts = schema.judged_parts(key.criterion)
    if parts is not None:  # the judge's pairs with the people's verdicts beside
        return judged_pairs_of_runs(store, [key.run_key], judge=parts[0], people=parts[1], estimator=key.estimator,
                                    missing=keeps_missing(policy)).select("question_id", "score", "error", "human",
                                                                          "at")
    return labelled_pairs_of_runs(store, [key.run_key], estimator=key.estimator, criterion=key.criterion,
                                  missing=keeps_missing(policy)).select("question_id", "score", "error", "at")


def settled(pairs: pl.DataFrame, through: datetime | None) -> pl.DataFrame:
    """The pairs a certificate may count: seen (`at`) at or before `through` — now − the label window —, whose
    labels can no longer be late; one cut for single gates, system gates and anytime states alike. Every pair when
    there is no cut."""
    return pairs if through is None else pairs.filter(pl.col("at") <= through)


def span(pairs: pl.DataFrame) -> tuple[datetime | None, datetime | None]:
    """The (first, last) `at` of some pairs: a gate's window."""
    if pairs.height == 0:
        return None, None
    return pairs.get_column("at").min(), pairs.get_column("at").max()  # type: ignore[return-value]
