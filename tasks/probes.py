"""Prefect task: fit the configured probes on each run's kept hidden states and store them with their scores
(`cic.pipeline.run.probe_stage`); one line in the run's log."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.config import ProbesConfig
from cic.pipeline.run.probe_stage import ProbeStats, fit_run_probes
from cic.services.prefect_runs import named_by_runs, run_logger


@task(name="probes", task_run_name=named_by_runs("probes"), cache_policy=NO_CACHE, timeout_seconds=6 * 3600)
def fit_probes(db: str, run_keys: Sequence[str], probes: ProbesConfig) -> ProbeStats:
    """Accuracy probes on each run's fit split, entropy probes on every question; stored probes are kept."""
    stats = fit_run_probes(db, list(run_keys), probes)
    if probes.kinds:
        run_logger().info("probes: %d fitted, %d kept from an earlier run%s", len(stats.fitted), len(stats.kept),
                          "".join(f"; skipped {why}" for why in stats.skipped))
    return stats
