"""Prefect tasks of the scheduled recalibration: new gates on the newest window, stored and logged to MLflow."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mlflow import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from cic import schema
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.recalibration import Recalibration, recalibrate_group
from cic.pipeline.stored_calibration import groups_of_run
from cic.stats.calibration import CalibrationResult
from cic.store import Store
from tasks.log import tracking_uri
from tasks.tracking import ChildRun, GroupLog, log_group

log = logging.getLogger("cic.recalibrate")
DRIFT_METRICS = ("previous_threshold", "threshold_change", "coverage_previous_threshold", "coverage",
                 "coverage_change", "ks_statistic", "ks_p_value")


@task(name="recalibrate", cache_policy=NO_CACHE)
def recalibrate_runs(db: str, run_keys: Sequence[str], calibration: CalibrationConfig, *, window: int | None,
                     shift_p_value: float) -> list[Recalibration]:
    """Recalibrate every group of the runs on its newest window and store the new gates."""
    results: list[Recalibration] = []
    with Store.open(db, wait_s=60) as store:
        runs = [r for r in store.read("runs").iter_rows(named=True) if r["run_key"] in set(run_keys)]
        for run in runs:
            for key in groups_of_run(store, run):
                rows, found = recalibrate_group(store, key, calibration, window=window, shift_p_value=shift_p_value)
                store.upsert("calibrations", rows)
                results.extend(found)
    for item in results:
        for alert in item.alerts:
            log.warning("%s/%s %s × %s, alpha %g (%s, %s): %s", item.key.model, item.key.dataset, item.key.estimator,
                        item.key.criterion, item.row["alpha"], item.row["bound"], item.row["search"], alert.upper())
    return results


def _child(item: Recalibration) -> ChildRun:
    row, drift = item.row, item.drift
    metrics: dict[str, float | None] = {"threshold": row["threshold"], "bound_value": row["bound_value"],
                                        "n_cal": row["n_cal"], "n_accepted": row["n_accepted"],
                                        "feasible": 0.0 if row["threshold"] is None else 1.0}
    if drift is not None:
        metrics.update({m: getattr(drift, m) for m in DRIFT_METRICS})
        metrics["shift_detected"] = float(drift.shift_detected)
        metrics["became_unattainable"] = float(drift.became_unattainable)
    gate = CalibrationResult.from_json(row["result_json"]).gate().to_json()
    return ChildRun(
        name=f"alpha={row['alpha']:g} {row['bound']} {row['search']}",
        params={"alpha": row["alpha"], "bound": row["bound"], "search": row["search"], "delta": row["delta"],
                "calibration_id": row["calibration_id"],
                "previous_calibration_id": item.previous["calibration_id"] if item.previous else "none"},
        metrics=metrics,
        tags={"cic.alpha_unattainable": str(row["threshold"] is None).lower(),
              "cic.alerts": " | ".join(item.alerts) or "none"},
        texts={"gate.json": gate, "drift.json": schema.canonical_json(drift.as_dict() if drift else {})})


@task(name="log-recalibration", retries=2, retry_delay_seconds=[5, 30], cache_policy=NO_CACHE)
def log_recalibrations(results: Sequence[Recalibration], *, tracking: str | None = None,
                       experiment_prefix: str = "cic") -> list[str]:
    """One MLflow parent run per recalibrated group (tag cic.kind = recalibration), nested per alpha × bound."""
    client = MlflowClient(tracking_uri=tracking_uri(tracking))
    by_group: dict[Any, list[Recalibration]] = {}
    for item in results:
        by_group.setdefault(item.key, []).append(item)
    run_ids = []
    for key, items in by_group.items():
        ids = sorted(i.row["calibration_id"] for i in items)
        unattainable = any(i.row["threshold"] is None for i in items)
        group = GroupLog(
            experiment=f"{experiment_prefix}-{key.dataset}",
            run_name=f"recalibration · {key.model} · {key.estimator} · {key.criterion}",
            log_key=schema.stable_hash("recalibration", *ids),
            tags={"cic.kind": "recalibration", "cic.model": key.model, "cic.dataset": key.dataset,
                  "cic.estimator": key.estimator, "cic.criterion": key.criterion, "cic.run_key": key.run_key,
                  "cic.alpha_unattainable": str(unattainable).lower(),
                  "cic.shift_detected": str(any(i.drift is not None and i.drift.shift_detected
                                                for i in items)).lower()},
            params={"run_key": key.run_key, "data_fingerprint": items[0].row["data_fingerprint"],
                    "n_window": items[0].row["n_cal"], "window_from": str(items[0].row["window_from"]),
                    "window_to": str(items[0].row["window_to"])},
            metrics={"n_window": float(items[0].row["n_cal"]),
                     "unattainable_gates": float(sum(i.row["threshold"] is None for i in items))},
            children=[_child(i) for i in items])
        run_id, _ = log_group(client, group)
        run_ids.append(run_id)
    return run_ids
