"""Prefect tasks of the scheduled recalibration: candidate gates on the newest window, drift tests corrected
together, candidates stored (and promoted where the policy allows), and everything logged to MLflow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlflow import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cic import schema
from cic.pipeline import progress
from cic.pipeline.alerts import counts_line, headline
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX, CalibrationConfig, RecalibrationConfig
from cic.pipeline.recalibration import Candidate, RecalibrationPass, WindowRule, recalibrate_store
from cic.pipeline.stored_calibration import GroupKey
from cic.services.mlflow_setup import check_before_logging
from cic.services.mlflow_tracking import ChildRun, GroupLog, check_reachable, log_group, tracking_uri
from cic.services.prefect_runs import named_by_runs
from cic.stats.calibration import CalibrationResult
from cic.store import Store

__all__ = ["Candidate", "RecalibrationPass", "log_recalibrations", "recalibrate_runs"]
LOGGED_ALERTS = 20


@task(name="recalibrate", task_run_name=named_by_runs("recalibrate"), cache_policy=NO_CACHE, timeout_seconds=3600)
def recalibrate_runs(db: str, run_keys: Sequence[str], calibration: CalibrationConfig, policy: RecalibrationConfig,
                     rule: WindowRule) -> RecalibrationPass:
    """Candidates for every group of the runs in one pass over the store, Holm across all drift tests,
    candidates stored with their alerts (and promoted where the policy allows)."""
    logger = get_run_logger()
    with Store.open(db, wait_s=300) as store:
        out = recalibrate_store(store, run_keys, calibration, policy.alert_level, rule,
                                auto_promote=policy.promotion == "auto", on_alarm=policy.on_alarm)
    for key, why in out.skipped[:LOGGED_ALERTS]:
        logger.info("%s/%s %s × %s: skipped, %s", key.model, key.dataset, key.estimator, key.criterion, why)
    placed = [(f"{k.model}/{k.dataset} {k.estimator} × {k.criterion} α={r['alpha']:g} {r['bound']} {r['search']}", a)
              for k, r, a in [(c.key, c.row, a) for c, a in out.alerts]
              + [(m.key, m.gate, m.alert()) for m in out.monitor_alarms]]
    if placed:  # the run log's first alert line is the headline; every alert is in the run's artifact
        head = headline(placed)
        (logger.error if head.startswith("PAGE") else logger.warning)("%s", head)
    for gate_id, why in out.withdrawn.items():
        logger.error("WITHDRAWN live gate %s: serves nothing from now on (%s); promote a recalibrated gate or "
                     "confirm it with `cic gate confirm %s`", gate_id[:12], why, gate_id[:12])
    logger.info("recalibration: %d candidate gate(s), %d alert(s) (%s), %d promoted, %d withdrawn, %d group(s) "
                "skipped", len(out.candidates), len(placed), counts_line(a for _, a in placed) or "none",
                len(out.promoted), len(out.withdrawn), len(out.skipped))
    return out


def _child(item: Candidate, monitor_of: dict[str, dict[str, Any]]) -> ChildRun:
    row, live = item.row, item.live
    metrics: dict[str, float | None] = {"alpha": row["alpha"], "threshold": row["threshold"],
                                        "bound_value": row["bound_value"],
                                        "n_cal": row["n_cal"], "n_accepted": row["n_accepted"],
                                        "n_errors": row["n_errors"],
                                        "feasible": 0.0 if row["threshold"] is None else 1.0,
                                        "alerts": float(len(item.alerts))}
    if live is not None:
        metrics["live_threshold"] = live["threshold"]
        monitor = monitor_of.get(live["calibration_id"])
        if monitor is not None:  # the live gate's anytime-valid monitor, as of this pass
            metrics.update(live_monitor_e_value=monitor["e_value"], live_rate_lower_bound=monitor["rate_lower_bound"],
                           live_monitor_alarmed=float(monitor["alarmed"]), live_monitor_answered=float(monitor["n"]))
        if live["threshold"] is not None and row["threshold"] is not None:
            metrics["threshold_change"] = row["threshold"] - live["threshold"]
    gate = CalibrationResult.from_json(row["result_json"]).gate().to_json()
    return ChildRun(
        name=f"{item.key.model} · {item.key.estimator} · {item.key.criterion} · {row['bound']} · {row['search']} · "
             f"α={row['alpha']:g}",
        params={"alpha": row["alpha"], "bound": row["bound"], "search": row["search"], "delta": row["delta"],
                "certified_together": row.get("groups") or 1, "calibration_id": row["calibration_id"],
                "live_calibration_id": live["calibration_id"] if live else "none"},
        metrics=metrics,
        tags={"cic.alpha": f"{row['alpha']:g}", "cic.bound": row["bound"], "cic.search": row["search"],
              "cic.gate_id": row["calibration_id"], "cic.gate_state": item.state,
              "cic.alpha_unattainable": str(row["threshold"] is None).lower(),
              "cic.alerts": " | ".join(item.alerts) or "none"},
        texts={"gate.json": gate, "alerts.json": schema.canonical_json({"alerts": item.alerts})})


@task(name="log-recalibration", task_run_name=named_by_runs("log-recalibration"), retries=2,
      retry_delay_seconds=[5, 30], cache_policy=NO_CACHE, timeout_seconds=900)
def log_recalibrations(result: RecalibrationPass, *, tracking: str | None = None,
                       experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX) -> list[str]:
    """One MLflow parent run per recalibrated group (the pipeline's tags, cic.kind = recalibration), nested per
    alpha × bound × search with the gate id and state; the group's drift tests as parent metrics."""
    from prefect.runtime import flow_run

    check_reachable(tracking_uri(tracking))
    check_before_logging(tracking_uri(tracking))
    client = MlflowClient(tracking_uri=tracking_uri(tracking))
    run_tag = {"cic.flow_run_id": str(flow_run.id)} if flow_run.id else {}
    by_group: dict[GroupKey, list[Candidate]] = {}
    for item in result.candidates:
        by_group.setdefault(item.key, []).append(item)
    monitor_of = {m.gate["calibration_id"]: m.row for m in result.monitors}
    alarms_of: dict[GroupKey, int] = {}
    for alarm in result.monitor_alarms:  # counted on its group like any alert: every surface counts the same
        alarms_of[alarm.key] = alarms_of.get(alarm.key, 0) + 1
    checks_by_group: dict[GroupKey, list[Any]] = {}
    for key, check in result.checks:
        checks_by_group.setdefault(key, []).append(check)
    run_ids = []
    for done, (key, items) in enumerate(by_group.items(), 1):
        first = items[0].row
        checks = checks_by_group.get(key, [])
        shift = [c for c in checks if c.test.name == "score_shift"]
        metrics: dict[str, float | None] = {
            "n_window": float(first["n_cal"]),
            "alerts": float(sum(len(i.alerts) for i in items) + alarms_of.get(key, 0)),
            "monitor_alarms": float(alarms_of.get(key, 0)),
            "unattainable_gates": float(sum(i.row["threshold"] is None for i in items))}
        if shift:
            metrics.update(ks_statistic=shift[0].test.statistic, ks_p_value=shift[0].test.p_value)
        errors = [c for c in checks if c.test.name == "error_rate"]
        if errors:
            metrics["min_error_rate_p_value"] = min(c.test.p_value for c in errors)
        group = GroupLog(
            experiment=f"{experiment_prefix}-{key.dataset}",
            run_name=f"recalibration · {key.model} · {key.estimator} · {key.criterion}",
            log_key=schema.stable_hash("recalibration", *sorted(i.row["calibration_id"] for i in items)),
            tags={"cic.kind": "recalibration", "cic.model": key.model, "cic.dataset": key.dataset,
                  "cic.estimator": key.estimator, "cic.criterion": key.criterion, "cic.run_key": key.run_key,
                  "cic.data_fingerprint": first["data_fingerprint"],
                  "cic.alpha_unattainable": str(metrics["unattainable_gates"] > 0).lower(),
                  "cic.shift_detected": str(any(c.rejected for c in checks) or key in alarms_of).lower(),
                  "cic.monitor_alarm": str(key in alarms_of).lower(),
                  "cic.alerts": str(int(metrics["alerts"] or 0)), **run_tag},
            params={"run_key": key.run_key, "data_fingerprint": first["data_fingerprint"], "n_window": first["n_cal"],
                    "window_from": str(first["window_from"]), "window_to": str(first["window_to"]),
                    "drift_tests": [c.test.as_dict() | {"rejected": c.rejected} for c in checks]},
            metrics=metrics, children=[_child(i, monitor_of) for i in items])
        run_id, _ = log_group(client, group)
        run_ids.append(run_id)
        progress.report("log recalibrations", done, len(by_group))
    return run_ids
