"""Log what the store holds to MLflow, skipping groups already logged: the pipeline's log task, `cic log` and
`cic log TABLE` all call `log_store`.

Everything logged comes from DuckDB (runs, calibrations, evaluations and the pairs themselves), so a flow
whose tracking server was down loses nothing: the next flow run or `cic log` logs the missing groups, and
the `cic.log_key` tag (a hash of the evaluation id and the gate ids) keeps reruns from duplicating runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
from mlflow import MlflowClient

from cic import schema
from cic.pipeline import progress
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.group_reports import log_key, log_units, pipeline_calibrations, write_unit_report
from cic.pipeline.run_results import LogStats
from cic.services.mlflow_setup import check_before_logging
from cic.services.mlflow_tracking import (
    ChildRun,
    DatasetRef,
    GroupLog,
    check_reachable,
    find_logged,
    log_group,
    requests_in_flight,
    tracking_uri,
)
from cic.stats.calibration import CalibrationResult
from cic.store import Store
from cic.store.outputs import guard_output_dir
from cic.store.queries import generated_tokens

GROUPS_IN_FLIGHT = 2  # against a server: one group sent while the next renders (x REQUESTS_IN_FLIGHT each)
CHILD_METRICS = ("fdr_mean", "fdr_std", "fdr_above_alpha", "coverage_mean", "coverage_std", "correct_coverage_mean",
                 "fails", "base_error_rate", "threshold_mean")


def _child_runs(calibrations: pl.DataFrame, evaluations: pl.DataFrame, unit: dict[str, Any]) -> list[ChildRun]:
    """One nested run per (bound, search, alpha): named so a runs table reads without opening it, alpha as a
    metric too (so MLflow's charts can put it on the x-axis across runs), every metric present (an unattainable
    alpha: feasible = 0, fails = every split, no threshold)."""
    children = []
    for gate in calibrations.sort("search", "bound", "alpha").iter_rows(named=True):
        match = evaluations.filter(alpha=gate["alpha"], bound=gate["bound"], search=gate["search"])
        split = match.row(0, named=True) if match.height else {}
        result = json.loads(gate["result_json"])
        unattainable = gate["threshold"] is None
        gate_json = CalibrationResult.from_json(gate["result_json"]).gate().to_json()
        children.append(ChildRun(
            name=f"{unit['model']} · {unit['estimator']} · {unit['criterion']} · {gate['bound']} · {gate['search']} · "
                 f"α={gate['alpha']:g}",
            params={"alpha": gate["alpha"], "bound": gate["bound"], "search": gate["search"],
                    "delta": gate["delta"], "calibration_id": gate["calibration_id"],
                    "n_candidates": result.get("n_candidates")},
            metrics={"alpha": gate["alpha"], "threshold": gate["threshold"], "bound_value": gate["bound_value"],
                     "n_accepted": gate["n_accepted"], "n_errors": gate["n_errors"], "n_cal": gate["n_cal"],
                     "feasible": 0.0 if unattainable else 1.0, **{m: split.get(m) for m in CHILD_METRICS}},
            tags={"cic.alpha": f"{gate['alpha']:g}", "cic.bound": gate["bound"], "cic.search": gate["search"],
                  "cic.alpha_unattainable": str(unattainable).lower()},
            texts={"gate.json": gate_json}))
    return children


def experiment_prefix_of(store: Store, run_key: str, explicit: str | None) -> str:
    """Where a run's groups are logged: the explicit prefix, else the one its config recorded, else "cic"."""
    if explicit:
        return explicit
    rows = store.read("runs", run_key=run_key)
    return (rows.get_column("experiment_prefix")[0] if rows.height else None) or DEFAULT_EXPERIMENT_PREFIX


ALPHA_STEP = "_by_alpha_pct"  # in a series' name: its step is 100·alpha (MLflow steps are integers)


def alpha_series(calibrations: pl.DataFrame, evaluations: pl.DataFrame) -> dict[str, dict[int, float | None]]:
    """threshold, UCB, FDR and coverage per (bound, search) as metrics whose step is alpha x 100, named so:
    `coverage_by_alpha_pct.cp.fixed_sequence` (the nested runs carry alpha itself as a metric)."""
    series: dict[str, dict[int, float | None]] = {}
    for gate in calibrations.iter_rows(named=True):
        step, suffix = round(gate["alpha"] * 100), f"{gate['bound']}.{gate['search']}"
        series.setdefault(f"threshold{ALPHA_STEP}.{suffix}", {})[step] = gate["threshold"]
        series.setdefault(f"ucb{ALPHA_STEP}.{suffix}", {})[step] = gate["bound_value"]
    for row in evaluations.iter_rows(named=True):
        step, suffix = round(row["alpha"] * 100), f"{row['bound']}.{row['search']}"
        series.setdefault(f"fdr{ALPHA_STEP}.{suffix}", {})[step] = row["fdr_mean"]
        series.setdefault(f"coverage{ALPHA_STEP}.{suffix}", {})[step] = row["coverage_mean"]
    return series


def build_group(store: Store, unit: dict[str, Any], experiment_prefix: str, report_root: Path) -> GroupLog:
    """Parent run params/metrics/artifacts and nested runs for one unit, from the store (its report written first,
    the same as `cic run --no-mlflow` writes)."""
    report = write_unit_report(store, unit, report_root)
    run, calibrations, evaluations, pairs = report.run, report.calibrations, report.evaluations, report.pairs
    first, searches, slug, out = evaluations.row(0, named=True), report.searches, report.key, report.out
    params = {"model": unit["model"], "dataset": unit["dataset"], "split": run["split"],
              "prompt_id": run["prompt_id"], "estimator": unit["estimator"], "criterion": unit["criterion"],
              "run_key": unit["run_key"], "data_fingerprint": unit["data_fingerprint"],
              "generation_config": run["generation_config"], "delta": first["delta"], "n_splits": first["n_splits"],
              "cal_fraction": first["cal_fraction"], "seed": first["seed"], "n_questions": pairs.height,
              "alphas": sorted(set(evaluations.get_column("alpha").to_list())),
              "bounds": sorted(set(evaluations.get_column("bound").to_list())), "searches": list(searches)}
    tags = {"cic.model": unit["model"], "cic.dataset": unit["dataset"], "cic.estimator": unit["estimator"],
            "cic.criterion": unit["criterion"], "cic.run_key": unit["run_key"], "cic.kind": "pipeline",
            "cic.data_fingerprint": unit["data_fingerprint"]}
    return GroupLog(
        experiment=f"{experiment_prefix}-{unit['dataset']}",
        run_name=f"{unit['model']} · {unit['estimator']} · {unit['criterion']}",
        log_key=slug, tags=tags, params=params,
        metrics={"base_error_rate": first["base_error_rate"], "n_questions": float(pairs.height),
                 "generated_tokens": float(generated_tokens(store, unit["run_key"])),
                 **({"unanswered_questions": float(run["unanswered"])} if run.get("unanswered") is not None
                    else {})},
        artifacts=[out / "tables", out / "figures"],  # each renders in MLflow's artifact view on its own
        children=_child_runs(calibrations, evaluations, unit), series=alpha_series(calibrations, evaluations),
        dataset=DatasetRef(name=f"{unit['dataset']}/{run['split']}", digest=question_set_digest(pairs, unit),
                           source=f"{store.path.name}#run_key={unit['run_key']}",
                           profile={"questions": pairs.height}))


def question_set_digest(pairs: pl.DataFrame, unit: dict[str, Any]) -> str:
    """MLflow's dataset digest: the questions (dataset and ids), not the estimator or criterion that scored and
    labelled them, so one question set is one dataset version in MLflow's Datasets filter."""
    return schema.stable_hash(unit["dataset"], *sorted(pairs.get_column("question_id").to_list()), length=36)


def log_store(db: str, *, tracking: str | None = None, experiment_prefix: str | None = None,
                report_dir: str = "cic-reports", run_keys: Sequence[str] | None = None,
                flow_run_id: str | None = None) -> LogStats:
    """Log every stored unit not yet in MLflow (parent per group, nested run per alpha × bound × search), tagged
    with the Prefect flow run that logged it (`cic.flow_run_id`) when there is one.

    Each group goes to '<prefix>-<dataset>', the prefix being `experiment_prefix` or, when None, the one the
    run's config recorded in the store — so `cic log` after `cic run` finds everything already there.
    """
    uri = tracking_uri(tracking)
    check_reachable(uri)
    check_before_logging(uri)
    guard_output_dir(report_dir, "report_dir")  # cic's own directory (marked), never one holding other files
    client = MlflowClient(tracking_uri=uri)
    in_flight = requests_in_flight(uri)
    sent: list[tuple[Future[tuple[str, bool]], str | None]] = []  # per unit: (run id, new), its report dir
    with Store.open(db, read_only=True, wait_s=60) as store, \
            ThreadPoolExecutor(GROUPS_IN_FLIGHT if in_flight > 1 else 1, thread_name_prefix="cic-log") as pool:
        units = log_units(store, run_keys)
        keys = [log_key(unit["evaluation_id"], pipeline_calibrations(store, unit)) for unit in units]
        found = list(pool.map(lambda key: find_logged(client, key), keys))  # lookups concurrently too
        for unit, existing in zip(units, found, strict=True):
            if existing is not None:
                done: Future[tuple[str, bool]] = Future()
                done.set_result((existing, False))
                sent.append((done, None))
            else:  # store reads and figures here, one group at a time (matplotlib is not thread-safe), while
                # the groups before it are sent
                group = build_group(store, unit, experiment_prefix_of(store, unit["run_key"], experiment_prefix),
                                    Path(report_dir))
                if flow_run_id:  # which Prefect flow run logged it: from the MLflow run to its logs and back
                    group = replace(group, tags={**group.tags, "cic.flow_run_id": flow_run_id})
                sent.append((pool.submit(log_group, client, group, in_flight=in_flight),
                             str(group.artifacts[0].parent)))
            _report_progress([future for future, _ in sent], len(units))
        for _ in as_completed(future for future, _ in sent):
            _report_progress([future for future, _ in sent], len(units))
    stats = LogStats()
    for future, _ in sent:
        run_id, new = future.result()
        stats.logged += int(new)
        stats.already += int(not new)
        stats.run_ids.append(run_id)
    return stats


def _report_progress(futures: list[Future[tuple[str, bool]]], total: int) -> None:
    """Progress counts groups whose logging finished; a group that failed stops the pass at once (its error
    raised here), not after every other group."""
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()
    progress.report("log", sum(future.done() for future in futures), total)
