"""Prefect task: log what the store holds to MLflow (`cic.services.mlflow_results.log_store`), skipping groups
already logged; a server that is down is not retried (the next run or `cic log` logs what is missing)."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.run.run_results import LogStats
from cic.services.mlflow_results import log_store
from cic.services.prefect_runs import named_by_runs, run_logger


@task(name="log", task_run_name=named_by_runs("log"), retries=1, retry_delay_seconds=5,
      retry_condition_fn=lambda task, run, state: not isinstance(
    state.result(raise_on_failure=False), ConnectionError), cache_policy=NO_CACHE)
def log_results(db: str, *, tracking: str | None = None, experiment_prefix: str | None = None,
                report_dir: str = "cic-reports", run_keys: Sequence[str] | None = None,
                flow_run_id: str | None = None) -> LogStats:
    """Every stored group not yet in MLflow, tagged with this flow run; one line in the run's log."""
    stats = log_store(db, tracking=tracking, experiment_prefix=experiment_prefix, report_dir=report_dir,
                      run_keys=run_keys, flow_run_id=flow_run_id)
    run_logger().info("MLflow: %d group(s) logged, %d already there", stats.logged, stats.already)
    return stats
