"""Prefect task: store a file of production records (or of labels alone) — `cic.pipeline.ingest` does the work."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.durations import parse_duration
from cic.pipeline.ingest import IngestStats, ingest_file
from cic.services.prefect_runs import named_by_runs
from cic.store import Store


@task(name="ingest", task_run_name=named_by_runs("ingest"), cache_policy=NO_CACHE, timeout_seconds=1800)
def ingest_records(db: str, path: str, *, label_name: str = "human", criterion: str | None = None,
                   experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX, relabel: bool = False, max_skew: str = "5m",
                   timezone: str | None = None, group: str | None = None) -> IngestStats:
    """Check every record, then store the whole file in one transaction (or nothing, naming the bad record)."""
    skew = parse_duration(max_skew, "max_skew")
    with Store.open(db, wait_s=300) as store:
        stats = ingest_file(store, path, label_name=label_name, criterion=criterion, relabel=relabel,
                            max_skew=skew, timezone=timezone, experiment_prefix=experiment_prefix, group=group)
    get_run_logger().info("%s: %d record(s), %d labelled, %d waiting for labels", path, stats.records, stats.labels,
                          stats.unlabelled)
    return stats
