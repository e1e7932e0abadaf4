"""Production traffic in: each file of records (or of labels) is checked and stored; the next recalibration
uses whatever is labelled. A deployment runs it on a schedule over a drop folder, or once per file.

    files (Parquet / CSV / JSONL), Delta tables ──► check every record ──► DuckDB (questions, answers, scores, labels)
"""

from __future__ import annotations

from prefect import flow

from cic.pipeline.production.ingest import IngestOptions, IngestStats
from cic.services.prefect_limits import store_slot
from tasks.ingest import ingest_records


@flow(name="cic-ingest", log_prints=True)
def ingest_flow(paths: list[str], db: str = "cic.duckdb", options: IngestOptions | None = None,
                concurrency_limit: str | None = "cic-store") -> list[IngestStats]:
    """Ingest the files (or Delta tables: what each gained since) in order (records before the labels that refer
    to them); a bad file fails the run and stores nothing of itself, files before it stay stored."""
    with store_slot(concurrency_limit):
        return [stats for path in paths for stats in ingest_records(db, path, options or IngestOptions())]
