"""Ad hoc calibration from what DuckDB already holds: new alphas, delta, bounds or searches, no regeneration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import flow

from cic.errors import UserError
from cic.pipeline.config import DEMO_CONFIG, flow_config
from cic.pipeline.run.run_results import CalibrationRunSummary
from cic.pipeline.run.stored_calibration import stored_run_keys
from cic.services.prefect_limits import store_slot
from cic.services.prefect_runs import flow_run_name
from cic.store import Store
from tasks.calibrate import calibrate_runs
from tasks.log import log_results


@flow(name="cic-calibrate", flow_run_name=flow_run_name("calibrate"), log_prints=True)
def calibrate_flow(config_path: str = DEMO_CONFIG, db: str | None = None, tracking: str | None = None,
                   alphas: Sequence[float] | None = None, delta: float | None = None,
                   bounds: Sequence[str] | None = None, searches: Sequence[str] | None = None,
                   log_to_mlflow: bool = True, config: Any = None) -> CalibrationRunSummary:
    """Calibrate + split protocol for every stored run of the config's models and datasets, then log. `config`: the
    `PipelineConfig` its command parsed (typed `Any`: a served deployment builds its parameter schema from this
    signature without the config's module)."""
    from cic.pipeline.config import CalibrationConfig

    config = flow_config(config_path, config, db, tracking=tracking)
    changes = {k: v for k, v in (("alphas", alphas), ("delta", delta), ("bounds", bounds), ("searches", searches))
               if v is not None}
    try:
        calibration = CalibrationConfig.model_validate({**config.calibration.model_dump(), **changes})
    except ValueError as exc:  # pydantic's ValidationError: a bad alpha, delta, bound or search parameter
        raise UserError(f"calibrate_flow parameters {changes}: {' '.join(str(exc).split())[:300]}") from None
    with store_slot(config.storage.concurrency_limit, timeout_s=config.storage.queue_timeout_s):
        with Store.open(config.storage.db, read_only=True, wait_s=300) as store:
            run_keys = stored_run_keys(store, [m.name for m in config.models], [d.name for d in config.datasets])
        stats = calibrate_runs(config.storage.db, run_keys, calibration)
    logged = None
    if log_to_mlflow:
        logged = log_results(config.storage.db, tracking=config.mlflow.tracking_uri,
                             experiment_prefix=config.mlflow.experiment_prefix, report_dir=config.storage.report_dir,
                             run_keys=run_keys)
    return CalibrationRunSummary(run_keys, stats, logged)
