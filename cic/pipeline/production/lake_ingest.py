"""Production records from a Delta table: each `cic ingest TABLE` takes in only the data files the store has not
read, with every check, flag and refusal of a file ingest (`ingest_file`), and resumes after a kill.

    Delta table ──new data files──► staged Parquet (beside the store) ──ingest_file──► DuckDB ──► lake_files

The new rows are staged as one Parquet file with a manifest of the data files it holds (written last); the
records are then ingested from it exactly as from a file a user gave, and the data files recorded in
`lake_files`. A kill before the manifest leaves nothing to resume; after it, the next ingest of the table first
ingests the very same staged bytes (so a cut-off journaled ingest completes), then whatever the table gained.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.production.ingest import Layout, ingest_file
from cic.pipeline.production.ingest_options import DEFAULT_OPTIONS, IngestOptions, IngestStats
from cic.store import lake

if TYPE_CHECKING:
    from cic.store import Store

FIELD = "table"
ICEBERG = "iceberg://"
RECORDS, MANIFEST = "records.parquet", "files.json"


@dataclass
class TableIngest:
    """One ingest of a table: the version read, its data files new to the store, and each staged part's stats."""

    uri: str
    version: int
    files: int = 0
    parts: list[IngestStats] = field(default_factory=list)


def is_table(source: str | Path) -> bool:
    """A URI (an object store's, or `iceberg://`), or a local directory holding a Delta log: a table, not a
    records file."""
    text = str(source)
    return "://" in text or (Path(text).expanduser() / "_delta_log").is_dir()


def staging_place(store: Store, table_uri: str) -> Path:
    """Where an ingest of this table stages its new rows (beside the store, named by the store and the table)."""
    digest = hashlib.sha256(table_uri.encode()).hexdigest()[:16]
    return store.path.parent / f".cic-lake-{store.path.name}-{digest}"


def open_source(uri: str | Path, field: str) -> lake.LakeSource:
    """A Delta table (a path or URI) or an Iceberg table (`iceberg://CATALOG/NAMESPACE.TABLE`)."""
    if str(uri).startswith(ICEBERG):
        from cic.store.iceberg import iceberg_source

        return iceberg_source(str(uri), field)
    return lake.delta_source(lake.open_table(uri, field), field)


def ingest_table(store: Store, uri: str | Path, options: IngestOptions = DEFAULT_OPTIONS,
                 **file_options: Any) -> TableIngest:
    """Ingest the records the table gained since this store last read it (a staged part cut off earlier first);
    `file_options` go to `ingest_file` (`now`, `batch_rows`, `commit_records`)."""
    table = open_source(uri, FIELD)
    Layout.of(table.columns, f"table {str(uri)!r}", options.group)  # before any staging
    place = staging_place(store, table.key)
    done = TableIngest(table.key, table.version)
    if (place / MANIFEST).exists():
        done.parts.append(_ingest_staged(store, place, options, file_options))
    new = lake.unloaded_files(store, table, FIELD, uri)
    if new:
        _stage(table, new, place)
        done.files = len(new)
        done.parts.append(_ingest_staged(store, place, options, file_options))
    return done


def _stage(table: lake.LakeSource, files: list[lake.DataFile], place: Path) -> None:
    """The files' rows as one Parquet file, then the manifest naming them (last: a manifest means complete)."""
    shutil.rmtree(place, ignore_errors=True)
    place.mkdir()
    rows = table.read(files)
    pl.from_arrow(rows).write_parquet(place / RECORDS)  # type: ignore[union-attr]
    manifest = {"table_uri": table.key, "version": table.version, "rows": rows.num_rows,
                "files": [[f.path, f.rows] for f in files]}
    (place / f"{MANIFEST}.tmp").write_text(json.dumps(manifest))
    (place / f"{MANIFEST}.tmp").replace(place / MANIFEST)


def _ingest_staged(store: Store, place: Path, options: IngestOptions, file_options: dict[str, Any]) -> IngestStats:
    """Ingest the staged part like a file, record its data files as read, and remove it."""
    manifest = json.loads((place / MANIFEST).read_text())
    stats = ingest_file(store, place / RECORDS, options, **file_options) if manifest["rows"] else IngestStats(file="")
    stats.file = f"{manifest['table_uri']} (version {manifest['version']}, {len(manifest['files'])} new data files)"
    store.upsert("lake_files", pl.DataFrame({
        "table_uri": manifest["table_uri"], "path": [p for p, _ in manifest["files"]],
        "version": manifest["version"], "rows": [n for _, n in manifest["files"]], "purpose": "ingest",
        "loaded_at": datetime.now(UTC)}, schema=schema.LAKE_FILES.schema))
    shutil.rmtree(place, ignore_errors=True)
    return stats


def ingest_source(store: Store, source: str, options: IngestOptions = DEFAULT_OPTIONS) -> list[IngestStats]:
    """A records file or a Delta table: what each stored part added (none: the table had nothing new)."""
    if is_table(source):
        return ingest_table(store, source, options).parts
    if not source.strip():
        raise UserError("file = '': give a records file or a Delta table")
    return [ingest_file(store, source, options)]
