"""The scheduled job: recalibrate on the newest labelled window, compare with the previous gates, log, alert.

Deployed with a cron schedule by `infra/prefect.yaml`; `cic recalibrate` runs it once by hand.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from cic.pipeline.config import load_config
from cic.pipeline.stored_calibration import stored_run_keys
from cic.store import Store
from flows.pipeline import DEMO_CONFIG, with_overrides
from tasks.recalibrate import log_recalibrations, recalibrate_runs


@flow(name="cic-recalibrate", log_prints=True)
def recalibrate_flow(config_path: str = DEMO_CONFIG, db: str | None = None, tracking: str | None = None,
                     window: int | None = None, log_to_mlflow: bool = True) -> dict[str, Any]:
    """Recalibrate every stored run of the config's models × datasets; returns the gates and their alerts."""
    config = with_overrides(load_config(config_path), db, None, tracking, None)
    window = window if window is not None else config.recalibration.window
    with Store.open(config.storage.db) as store:
        run_keys = stored_run_keys(store, [m.name for m in config.models], [d.name for d in config.datasets])
    results = recalibrate_runs(config.storage.db, run_keys, config.calibration, window=window,
                               shift_p_value=config.recalibration.shift_p_value)
    run_ids = log_recalibrations(results, tracking=config.mlflow.tracking_uri,
                                 experiment_prefix=config.mlflow.experiment_prefix) if log_to_mlflow else []
    alerts = [{"model": r.key.model, "dataset": r.key.dataset, "estimator": r.key.estimator,
               "criterion": r.key.criterion, "alpha": r.row["alpha"], "bound": r.row["bound"],
               "search": r.row["search"], "alert": a} for r in results for a in r.alerts]
    logger = get_run_logger()
    unattainable = [a for a in alerts if "unattainable" in a["alert"]]
    if unattainable:
        logger.error("%d gate(s) are UNATTAINABLE: the system abstains on everything there", len(unattainable))
    return {"gates": len(results), "alerts": alerts, "mlflow_run_ids": run_ids,
            "unattainable": len(unattainable), "thresholds": [
                {"model": r.key.model, "dataset": r.key.dataset, "estimator": r.key.estimator,
                 "criterion": r.key.criterion, "alpha": r.row["alpha"], "bound": r.row["bound"],
                 "search": r.row["search"], "threshold": r.row["threshold"],
                 "previous_threshold": r.previous["threshold"] if r.previous else None} for r in results]}
