"""Prefect task: calibrate and evaluate every (run, estimator, criterion) group the store holds, and store it
(`cic.pipeline.gates.calibrate_store`); one line in the run's log."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.run.run_results import CalibrateStats
from cic.services.prefect_runs import named_by_runs, run_logger


@task(name="calibrate", task_run_name=named_by_runs("calibrate"), cache_policy=NO_CACHE, timeout_seconds=6 * 3600)
def calibrate_runs(db: str, run_keys: Sequence[str], calibration: CalibrationConfig,
                   estimators: Sequence[str] | None = None, criteria: Sequence[str] | None = None) -> CalibrateStats:
    """Gate per (alpha, bound, search) on each group's pairs plus the split protocol; idempotent upserts. A gate
    whose key has no live gate yet goes live; later ones wait as candidates (`cic gate promote`)."""
    stats = calibrate_store(db, run_keys, calibration, estimators, criteria)
    run_logger().info("calibrated %d groups: %d gates (%d unattainable), %d evaluation rows, %d per-dataset "
                      "studies, %d system gates of cascades and estimators chosen (%d certify nothing)",
                      stats.groups, stats.calibrations, stats.unattainable, stats.evaluations, stats.group_studies,
                      stats.system_gates, stats.system_unattainable)
    return stats
