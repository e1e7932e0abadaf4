"""The store's tables in DuckDB's terms (polars dtypes to DuckDB types, CREATE TABLE from `cic.schema`), its schema
version, and the errors every part of the store raises."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import polars as pl

from cic import schema
from cic.errors import UserError

if TYPE_CHECKING:
    pass

SCHEMA_VERSION = 6
CREATED_AT = "created_at"
_CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
_SIMPLE_TYPES: tuple[tuple[pl.DataType, str], ...] = (
    (pl.String(), "VARCHAR"), (pl.Boolean(), "BOOLEAN"), (pl.Int8(), "TINYINT"), (pl.Int16(), "SMALLINT"),
    (pl.Int32(), "INTEGER"), (pl.Int64(), "BIGINT"), (pl.UInt32(), "UINTEGER"), (pl.UInt64(), "UBIGINT"),
    (pl.Float32(), "FLOAT"), (pl.Float64(), "DOUBLE"), (pl.Date(), "DATE"), (pl.Binary(), "BLOB"),
)
_SQL_TYPE_NAMES = {"TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ"}  # information_schema spelling -> ours
_batch_names = itertools.count()


class StoreError(UserError):
    """The store cannot be opened or used as asked; the message says why and what to do."""


class DamagedStoreError(StoreError):
    """The file is a DuckDB database that cannot be read (corrupt blocks, a damaged WAL)."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file."""


class NotADuckDBFileError(StoreError):
    """The path exists but is not a DuckDB database."""


def duckdb_type(dtype: pl.DataType) -> str:
    """The DuckDB column type for a polars dtype (the one place the two type systems meet)."""
    if isinstance(dtype, pl.List):
        return f"{duckdb_type(dtype.inner)}[]"
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMPTZ" if dtype.time_zone else "TIMESTAMP"
    for polars_type, sql_type in _SIMPLE_TYPES:
        if dtype == polars_type:
            return sql_type
    raise TypeError(f"no DuckDB type for polars dtype {dtype}")


def create_table_sql(spec: schema.TableSpec, name: str | None = None) -> str:
    """CREATE TABLE for a spec, with its natural key as PRIMARY KEY (what makes upserts possible)."""
    columns = ", ".join(f"{c} {duckdb_type(t)}" for c, t in spec.columns.items())
    return f"CREATE TABLE {name or spec.name} ({columns}, PRIMARY KEY ({', '.join(spec.key)}))"


def _table_spec(table: str) -> schema.TableSpec:
    if table not in schema.TABLES:
        raise UserError(f"table = {table!r}: unknown; tables are {', '.join(schema.TABLES)}")
    return schema.TABLES[table]
