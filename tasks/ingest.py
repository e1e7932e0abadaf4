"""Prefect task: store a file of production records (or of labels alone) — `cic.pipeline.production.ingest` does
the work."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cic.pipeline.production.ingest import IngestOptions, IngestStats
from cic.pipeline.production.lake_ingest import ingest_source
from cic.services.prefect_runs import named_by_runs
from cic.store import Store


@task(name="ingest", task_run_name=named_by_runs("ingest"), cache_policy=NO_CACHE, timeout_seconds=1800)
def ingest_records(db: str, path: str, options: IngestOptions) -> list[IngestStats]:
    """Check every record, then store the whole file in one transaction (or nothing, naming the bad record); a
    Delta table: what it gained since its last ingest."""
    options.skew()  # an absurd skew is refused before the store is opened
    with Store.open(db, wait_s=300) as store:
        parts = ingest_source(store, path, options)
    for stats in parts:
        get_run_logger().info("%s: %d record(s), %d labelled, %d waiting for labels", stats.file, stats.records,
                              stats.labels, stats.unlabelled)
    return parts
