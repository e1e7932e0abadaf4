"""The landing table: workers on any node append the generations, scores and labels of a batch to one Delta table
(one commit per batch: a batch lands whole or not at all), and the store loads what landed exactly once.

    workers ──append──► landing (Delta) ──load_landing──► DuckDB (generations, scores, labels) ──► calibrate

Each landing row says which store table it belongs to (`cic_table`), which append brought it (`cic_batch`, landed
at `cic_landed_at`) and carries that table's columns (the others null). A load reads the data files the store has
not loaded yet and upserts their rows with their file names into `lake_files`, in one DuckDB transaction: a load
killed midway stores nothing, a rerun or a second load adds nothing, and a question a retried worker landed twice
takes all its rows — generations, scores, labels — from the later append, also when compaction put both appends
in one file.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.store import lake

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from cic.store import Store

LANDED_TABLES = ("generations", "scores", "labels")
TABLE_COLUMN = "cic_table"
BATCH, LANDED_AT = "cic_batch", "cic_landed_at"  # which append a row came in, and when it was landed
FIELD = "storage.landing"
#: data files read per step of a load (memory stays bounded; every step is in the load's one transaction)
FILES_PER_STEP = 256


def check_landing_uri(value: str) -> str:
    """A landing place as given: a local path whose parent directory exists, or a URI of a known scheme;
    otherwise one line naming the field and value."""
    text = value.strip()
    lake.table_uri(text, FIELD)
    if "://" in text:
        return text
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"{FIELD} = {value!r}: is a file; give a directory for the Delta table")
    if not path.exists() and not path.parent.exists():
        raise UserError(f"{FIELD} = {value!r}: directory {str(path.parent)!r} does not exist")
    return text


def landed_table(uri: str | Path) -> DeltaTable | None:
    """The landing table, its layout checked, or None where nothing has landed yet (a local directory that is
    absent or empty); anything else there is refused in one line."""
    where = lake.table_uri(uri, FIELD)
    if "://" not in where:
        path = Path(where)
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return None
        if path.is_dir() and not (path / "_delta_log").is_dir():
            raise UserError(f"{FIELD} = {str(uri)!r}: a directory that holds no Delta table (no _delta_log); give "
                            "an empty or new directory")
    table = lake.find_table(uri, FIELD)
    if table is not None:
        lake.check_layout(table, landing_arrow_schema(), FIELD, uri, "a CIC landing table",
                          optional=added_later())
    return table


def landing_schema() -> pl.Schema:
    """`cic_table`, the batch (`cic_batch`, `cic_landed_at`) and the union of the three tables' columns (a column
    two tables share has one type)."""
    columns: dict[str, pl.DataType] = {TABLE_COLUMN: pl.String(), BATCH: pl.String(),
                                       LANDED_AT: pl.Datetime("us", "UTC")}
    for name in LANDED_TABLES:
        for column, dtype in schema.TABLES[name].columns.items():
            if columns.setdefault(column, dtype) != dtype:
                raise TypeError(f"{name}.{column}: {dtype} clashes with {columns[column]}")
    return pl.Schema(columns)


def added_later() -> set[str]:
    """Columns the landed tables gained after landing tables first shipped: a table made before lacks them, and its
    next append adds them (older files read as null)."""
    return {column for name in LANDED_TABLES for column in schema.TABLES[name].added_later}


def landing_arrow_schema() -> pa.Schema:
    return pl.DataFrame(schema=landing_schema()).to_arrow().schema


def landing_batch(tables: dict[str, Any]) -> pa.Table:
    """One worker batch (store table -> polars or Arrow rows) as landing rows, checked like a store write."""
    from cic.store.database import as_table_frame

    parts = [as_table_frame(name, tables[name]).with_columns(pl.lit(name).alias(TABLE_COLUMN))
             for name in LANDED_TABLES if tables.get(name) is not None]
    frame = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    frame = frame.with_columns(pl.lit(uuid.uuid4().hex).alias(BATCH),
                               pl.lit(datetime.now(UTC), dtype=pl.Datetime("us", "UTC")).alias(LANDED_AT))
    full = landing_schema()
    frame = frame.with_columns(pl.lit(None, dtype=d).alias(c) for c, d in full.items() if c not in frame.columns)
    return frame.select([pl.col(c).cast(d) for c, d in full.items()]).to_arrow()


def land(uri: str | Path, tables: dict[str, Any]) -> int:
    """Append one batch to the landing table in one commit (created on first use); returns its version."""
    return lake.append(uri, landing_batch(tables), FIELD, added_later=added_later())


@dataclass(frozen=True)
class LandingLoad:
    """What one load took in: the table version it read, the data files new to the store, rows per table."""

    uri: str
    version: int
    files: int
    rows: dict[str, int]


def latest_attempts(frame: pl.DataFrame) -> pl.DataFrame:
    """Per question, the rows of the latest append that landed it (a retried batch lands a question again; a
    compacted file holds both attempts): its generations, scores and labels come from one attempt, never mixed."""
    question = ["run_key", "question_id"]
    winners = (frame.select(*question, LANDED_AT, BATCH).unique()
               .sort([LANDED_AT, BATCH]).group_by(question, maintain_order=True).last())
    return frame.join(winners.select(*question, BATCH), on=[*question, BATCH], how="semi", nulls_equal=True)


def load_landing(store: Store, uri: str | Path) -> LandingLoad:
    """Upsert every landed row the store has not loaded (by data file) into its table, exactly once (nothing
    where nothing has landed yet: version -1)."""
    table = landed_table(uri)
    if table is None:
        return LandingLoad(lake.table_uri(uri), -1, 0, dict.fromkeys(LANDED_TABLES, 0))
    key = table.table_uri
    new = lake.unloaded_files(store, lake.delta_source(table, FIELD), FIELD, uri)
    rows = dict.fromkeys(LANDED_TABLES, 0)
    version = int(table.version())
    if new:
        now = datetime.now(UTC)
        with store.transaction():
            for start in range(0, len(new), FILES_PER_STEP):
                step = new[start:start + FILES_PER_STEP]
                frame = latest_attempts(pl.from_arrow(lake.read_files(table, step, FIELD)))
                for name in LANDED_TABLES:
                    part = schema.conform(frame.filter(pl.col(TABLE_COLUMN) == name), schema.TABLES[name])
                    rows[name] += store.upsert(name, part)
                store.upsert("lake_files", pl.DataFrame({
                    "table_uri": key, "path": [f.path for f in step], "version": version,
                    "rows": [f.rows for f in step], "purpose": "landing", "loaded_at": now},
                    schema=schema.LAKE_FILES.schema))
    return LandingLoad(key, version, len(new), rows)
