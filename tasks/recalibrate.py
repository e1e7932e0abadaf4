"""Prefect tasks of the scheduled recalibration: candidate gates on the newest window, drift tests corrected
together, candidates stored (and promoted where the policy allows), and everything logged to MLflow."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.alerts import PAGE, counts_line, headline, kind_of, severity
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX, CalibrationConfig, RecalibrationConfig
from cic.pipeline.gates.serving_state import restore_advice
from cic.pipeline.production.recalibration import RecalibrationPass, WindowRule, recalibrate_store
from cic.services.mlflow_results import log_recalibration
from cic.services.prefect_runs import named_by_runs
from cic.store import Store

__all__ = ["log_recalibrations", "recalibrate_runs"]
LOGGED_ALERTS = 20


@task(name="recalibrate", task_run_name=named_by_runs("recalibrate"), cache_policy=NO_CACHE, timeout_seconds=3600)
def recalibrate_runs(db: str, run_keys: Sequence[str], calibration: CalibrationConfig, policy: RecalibrationConfig,
                     rule: WindowRule) -> RecalibrationPass:
    """Candidates for every group of the runs in one pass over the store, Holm across all drift tests,
    candidates stored with their alerts (and promoted where the policy allows)."""
    logger = get_run_logger()
    with Store.open(db, wait_s=300) as store:
        out = recalibrate_store(store, run_keys, calibration, policy.alert_level, rule,
                                auto_promote=policy.promotion == "auto", on_alarm=policy.on_alarm,
                                anytime_grid=policy.anytime_grid if policy.rule == "anytime" else None,
                                label_window=policy.label_delay, missing_limit=policy.max_missing_share)
    for key, why in out.skipped[:LOGGED_ALERTS]:
        logger.info("%s/%s %s × %s: skipped, %s", key.model, key.dataset, key.estimator, key.criterion, why)
    placed = [(f"{k.model}/{k.dataset} {k.estimator} × {k.criterion} α={r['alpha']:g} {r['bound']} {r['search']}", a)
              for k, r, a in [(c.key, c.row, a) for c, a in out.alerts]
              + [(m.key, m.gate, m.alert()) for m in out.monitor_alarms]
              + [(u.key, {"alpha": u.alpha, "bound": "e-process", "search": "anytime"}, a) for u, a in out.notes]]
    if placed:  # the run log's first alert line is the headline; every alert is in the run's artifact
        worst = min((a for _, a in placed), key=lambda a: kind_of(a).rank)
        (logger.error if severity(worst) == PAGE else logger.warning)("%s", headline(placed))
    for gate_id, why in out.withdrawn.items():
        anytime = any(r.gate_id == gate_id and r.key.endswith(" anytime") for r in out.serving)
        logger.error("WITHDRAWN live gate %s: serves nothing from now on (%s); %s", gate_id[:12], why,
                     restore_advice(gate_id, anytime=anytime, ready=out.replacement_for(gate_id)))
    for update in out.anytime[:LOGGED_ALERTS]:  # the anytime rule's progress, per key and alpha
        logger.info("anytime %s/%s %s × %s α=%g: %d counted tonight, %d in all, %d waiting, first e-value %.3g, %s",
                    update.key.model, update.key.dataset, update.key.estimator, update.key.criterion, update.alpha,
                    update.counted_now, update.counted, update.waiting, update.first_e_value,
                    "nothing certified yet" if update.threshold is None else f"certifies {update.threshold:.4g}")
    logger.info("recalibration: %d candidate gate(s), %d alert(s) (%s), %d promoted, %d withdrawn, %d group(s) "
                "skipped", len(out.candidates) + len(out.systems), len(placed),
                counts_line(a for _, a in placed) or "none", len(out.promoted), len(out.withdrawn), len(out.skipped))
    return out


@task(name="log-recalibration", task_run_name=named_by_runs("log-recalibration"), retries=2,
      retry_delay_seconds=[5, 30], cache_policy=NO_CACHE, timeout_seconds=900)
def log_recalibrations(result: RecalibrationPass, *, tracking: str | None = None,
                       experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX) -> list[str]:
    """One MLflow run per recalibrated group (`cic.services.mlflow_layout`: the pipeline's layout, per-α table
    with each candidate beside the live gate, drift tests as metrics), tagged with this flow run."""
    from prefect.runtime import flow_run

    return log_recalibration(result, tracking=tracking, experiment_prefix=experiment_prefix,
                             flow_run_id=str(flow_run.id) if flow_run.id else None)
