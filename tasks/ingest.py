"""Prefect task: store a file of production records (or of labels alone) — `cic.pipeline.production.ingest` does
the work."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.production.ingest import IngestOptions, IngestStats, ingest_file
from cic.services.prefect_runs import named_by_runs
from cic.store import Store


@task(name="ingest", task_run_name=named_by_runs("ingest"), cache_policy=NO_CACHE, timeout_seconds=1800)
def ingest_records(db: str, path: str, options: IngestOptions) -> IngestStats:
    """Check every record, then store the whole file in one transaction (or nothing, naming the bad record)."""
    options.skew()  # an absurd skew is refused before the store is opened
    with Store.open(db, wait_s=300) as store:
        stats = ingest_file(store, path, options)
    get_run_logger().info("%s: %d record(s), %d labelled, %d waiting for labels", path, stats.records, stats.labels,
                          stats.unlabelled)
    return stats
