"""The DuckDB store: the single source of truth for questions, runs, generations, scores, labels, calibrations
and evaluations. Tables are created from `cic.schema` (polars dtypes mapped to DuckDB types in `duckdb_type`),
keyed by their natural keys, and written only by idempotent upserts.

One writer: DuckDB lets exactly one process open a file for writing (and while it does, no other process can
open it at all). Workers (Ray tasks, subprocesses) never open the store; they return polars DataFrames or
Arrow tables, and the one process that owns the `Store` writes them with `upsert` / `upsert_batches`.
A `Store` object belongs to one thread. All values travel as SQL parameters or registered Arrow batches;
table and column names come only from `cic.schema`, so no caller-provided text is ever spliced into SQL.

    with Store.open("cic.duckdb") as store:
        run = store.register_run(model, "trivia_qa", "validation", "short-answer-v1", {"k": 10})
        todo = store.missing_questions(run, questions["question_id"].to_list(), min_rows=11)
        store.upsert_batches("generations", worker_batches)       # from the workers, in one transaction
        pairs = store.calibration_frame(model, "trivia_qa", "semantic_entropy", "similarity[0.6]")
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

SCHEMA_VERSION = 6
CREATED_AT = "created_at"
_CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
_SIMPLE_TYPES: tuple[tuple[pl.DataType, str], ...] = (
    (pl.String(), "VARCHAR"), (pl.Boolean(), "BOOLEAN"), (pl.Int8(), "TINYINT"), (pl.Int16(), "SMALLINT"),
    (pl.Int32(), "INTEGER"), (pl.Int64(), "BIGINT"), (pl.UInt32(), "UINTEGER"), (pl.UInt64(), "UBIGINT"),
    (pl.Float32(), "FLOAT"), (pl.Float64(), "DOUBLE"), (pl.Date(), "DATE"),
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


# ----------------------------------------------------------------------------------------------------------
# Opening a file: clear errors for locks, foreign files and newer versions


def _check_is_duckdb_file(path: Path) -> None:
    """Refuse a file that is not a DuckDB database before DuckDB tries to (it may try extensions)."""
    if path.is_dir():
        raise NotADuckDBFileError(f"db = {str(path)!r} is a directory; give a database file path such as "
                                  f"{str(path / 'cic.duckdb')!r}")
    if not path.exists():
        return
    with path.open("rb") as handle:
        head = handle.read(16)
    if head[8:12] == b"DUCK":
        return
    kind = ("an empty file" if not head else "a SQLite database" if head.startswith(b"SQLite format 3")
            else "a Parquet file" if head.startswith(b"PAR1") else "some other kind of file")
    raise NotADuckDBFileError(f"db = {str(path)!r} is not a DuckDB database (it is {kind}); nothing was changed. "
                              "Pass --db with a new or existing .duckdb path, or move this file away.")


def _damaged(path: Path, exc: Exception) -> str:
    first = " ".join(str(exc).split())[:300]
    return (f"db = {str(path)!r} is damaged and cannot be read ({type(exc).__name__}: {first}). It was not "
            "changed. Recover: copy it aside, then `cic export TABLE out.parquet --db COPY` for each table that "
            "still reads, or restore from your Parquet exports, and `cic import` them into a new file")


# what DuckDB says when a block of its own file cannot be read (checksums, short reads); a database invalidated by
# such an error repeats it as its "Original error"
_DAMAGE = re.compile(r"corrupt database file|checksum .* does not match|could not read all bytes"
                     r"|failed to load metadata|block id|block_id", re.IGNORECASE)
# what it says when the file (or its WAL) cannot grow: a full disk, a quota, a file-size limit
_NO_SPACE = re.compile(r"file too large|no space left|quota exceeded|could not (write|truncate|extend) file"
                       r"|failed to create checkpoint", re.IGNORECASE)


def _duckdb_errors(exc: BaseException | None) -> Iterator[BaseException]:
    """The DuckDB errors in an exception and the ones it was raised while handling (the first one is the cause)."""
    import duckdb

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, duckdb.Error):
            yield exc
        exc = exc.__context__


def is_damage(exc: BaseException) -> bool:
    """Whether a DuckDB error says the file itself is damaged (not a bug, a lock or bad input)."""
    return any(_DAMAGE.search(str(e)) for e in _duckdb_errors(exc))


def is_no_space(exc: BaseException) -> bool:
    """Whether a DuckDB error says the file could not be written: the disk or the file-size limit is full."""
    return any(_NO_SPACE.search(str(e)) for e in _duckdb_errors(exc))


def _no_space(path: Path, exc: BaseException) -> str:
    """The one-line error for a write that found no room: the store keeps what was committed before it."""
    cause = [e for e in _duckdb_errors(exc) if _NO_SPACE.search(str(e))][-1]
    first = " ".join(str(cause).split())[:200]
    return (f"db = {str(path)!r}: disk full or file too large while writing ({type(cause).__name__}: {first}); the "
            "write that failed was rolled back and the store is unchanged by it (what was committed before stays) — "
            "free space (or raise the quota or file-size limit) and rerun the same command")


def _damaged_in_query(path: Path, exc: BaseException) -> str:
    """The one-line error for damage found by a query after the file opened: what failed and how to recover."""
    first = " ".join(str(exc).split())[:200]
    return (f"db = {str(path)!r} is damaged: a block of it could not be read ({type(exc).__name__}: {first}). The "
            "command stopped and the failed transaction wrote nothing. Recover: restore the file from a copy, or "
            "copy it aside, `cic export TABLE out.parquet --db COPY` for each table that still reads and "
            "`cic import` them into a new file")


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    import duckdb

    _check_is_duckdb_file(path)
    if read_only and not path.exists():
        raise StoreError(f"db = {str(path)!r} does not exist, so there is nothing to read; write results first "
                         "(or check the path)")
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=_CONNECT_CONFIG)
    except duckdb.IOException as exc:
        message = str(exc)
        if "lock" in message.lower():
            pid = re.search(r"PID (\d+)", message)
            holder = f"process {pid.group(1)}" if pid else "another process"
            raise StoreLockedError(
                f"db = {str(path)!r} is locked by {holder}: DuckDB lets one process open a database for writing, "
                "and no other process can open it meanwhile. Wait for that process to finish or stop it; pipeline "
                "workers must return batches to the single writer instead of opening the store.") from None
        if "not a valid DuckDB database" in message:
            raise NotADuckDBFileError(f"db = {str(path)!r} is not a DuckDB database: {message}") from None
        raise StoreError(f"db = {str(path)!r} cannot be opened: {message}") from None
    except duckdb.ConnectionException as exc:
        if "different configuration" in str(exc):
            mode = "read-write" if read_only else "read-only"
            raise StoreError(f"db = {str(path)!r} is already open {mode} in this process; use that Store (or "
                             "close it) instead of opening the file again in another mode") from None
        raise StoreError(f"db = {str(path)!r} cannot be opened: {exc}") from None
    con.execute("SET TimeZone = 'UTC'")
    return con


# ----------------------------------------------------------------------------------------------------------
# Schema version and migrations


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The single value a query returns."""
    return con.sql(sql, params=list(params)).fetchall()[0][0]


def _stored_columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    rows = con.sql("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'main' "
                   "AND table_name = ? ORDER BY ordinal_position", params=[table]).fetchall()
    return {name: data_type for name, data_type in rows}


def _has_primary_key(con: duckdb.DuckDBPyConnection, spec: schema.TableSpec) -> bool:
    rows = con.sql("SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = 'main' AND "
                   "table_name = ? AND constraint_type = 'PRIMARY KEY'", params=[spec.name]).fetchall()
    return any(tuple(cols) == spec.key for (cols,) in rows)


def rebuild_table(con: duckdb.DuckDBPyConnection, spec: schema.TableSpec) -> None:
    """Recreate a table in the spec's layout, keeping its rows: adds missing columns (null), casts types,
    adds the primary key. Rows repeating a key keep one of them; a null key is an error (nothing changes)."""
    stored = _stored_columns(con, spec.name)
    if not stored:
        con.execute(create_table_sql(spec))
        return
    extra = [c for c in stored if c not in spec.columns]
    if extra:
        raise StoreError(f"table {spec.name!r} has column(s) {', '.join(extra)} that cic.schema does not know; "
                         "rename or drop them (nothing was changed)")
    for column in spec.key:
        if column not in stored:
            raise StoreError(f"table {spec.name!r} lacks key column {column!r}; it cannot be migrated automatically")
        nulls = _scalar(con, f"SELECT count(*) FROM {spec.name} WHERE {column} IS NULL")
        if nulls:
            raise StoreError(f"table {spec.name!r} has {nulls} row(s) with a null {column!r}; fix or delete them "
                             "before migrating")
    select = ", ".join(f"CAST({c} AS {duckdb_type(t)})" if c in stored else f"CAST(NULL AS {duckdb_type(t)})"
                       for c, t in spec.columns.items())
    con.execute(create_table_sql(spec, f"{spec.name}__migrating"))
    con.execute(f"INSERT INTO {spec.name}__migrating ({', '.join(spec.columns)}) SELECT {select} FROM {spec.name} "
                f"QUALIFY row_number() OVER (PARTITION BY {', '.join(spec.key)}) = 1")
    con.execute(f"DROP TABLE {spec.name}")
    con.execute(f"ALTER TABLE {spec.name}__migrating RENAME TO {spec.name}")


def _migrate_to_1(con: duckdb.DuckDBPyConnection) -> None:
    """Version 0 = an unversioned file (tables made by hand or from exported Parquet): give every table the
    current layout and its primary key."""
    for spec in schema.TABLES.values():
        if list(_stored_columns(con, spec.name)) != list(spec.columns) or not _has_primary_key(con, spec):
            rebuild_table(con, spec)


def _migrate_to_2(con: duckdb.DuckDBPyConnection) -> None:
    """Version 2 gives gates states (`gate_events`): `cic ask` serves only a live gate. A file from before had
    served the newest gate of each key, so that gate (of the pipeline's, not a recalibration's) becomes live."""
    spec = schema.GATE_EVENTS
    _add_missing(con)  # the gate_events table, and columns a long-unopened file may lack (calibrations.kind)
    con.execute(
        f"INSERT INTO {spec.name} (event_id, calibration_id, state, reason, alerts, created_at) "
        "SELECT 'migrated-' || calibration_id, calibration_id, 'live', "
        "'schema version 2: the newest pipeline gate of its key, which cic ask served before', [], now() "
        "FROM calibrations WHERE coalesce(kind, 'pipeline') = 'pipeline' "
        "QUALIFY row_number() OVER (PARTITION BY model, dataset, estimator, criterion, alpha, delta, bound, search "
        "ORDER BY created_at DESC, calibration_id) = 1 ON CONFLICT DO NOTHING")


#: What runs recorded before version 3 in generation_config although it does not shape generations (it shapes
#: scores, which are keyed by estimator name instead): adding an estimator no longer means a new run.
SCORING_SETTINGS = ("estimators", "equivalence", "embedding_model", "embedding_threshold", "nli_model", "nli_variant")


def _migrate_to_3(con: duckdb.DuckDBPyConnection) -> None:
    """Version 3 keys a run by what shapes its generations only: the scoring settings leave each run's
    generation_config. Run keys stay as they are (every stored row, gate id and MLflow log key keeps its key);
    `register_run` finds a run by its generation_config, so a config with another estimator reuses it."""
    import json

    _add_missing(con)
    rows = con.sql("SELECT run_key, generation_config FROM runs").fetchall()
    for key, text in rows:
        try:
            config = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(config, dict) and any(k in config for k in SCORING_SETTINGS):
            kept = {k: v for k, v in config.items() if k not in SCORING_SETTINGS}
            con.execute("UPDATE runs SET generation_config = ? WHERE run_key = ?", [schema.canonical_json(kept), key])


def _migrate_to_4(con: duckdb.DuckDBPyConnection) -> None:
    """Version 4 keeps every change of a stored label (`label_events`): relabelling is explicit and recorded;
    and journals ingests written in several commits (`ingests`); and keeps each live gate's anytime-valid monitor,
    night by night (`gate_monitor`)."""
    _add_missing(con)


#: each system gate of version 4's `system_calibrations` table into `calibrations` (its `kind` is `system_kind`)
_V4_COLUMNS = tuple(c for c in schema.SYSTEM_GATE_COLUMNS if c not in ("favour", "prior"))  # version 4 had neither
_V4_SYSTEM_GATES_MOVE = ("INSERT INTO calibrations (" + ", ".join(_V4_COLUMNS) + ") SELECT "
                         + ", ".join("kind" if c == "system_kind" else c for c in _V4_COLUMNS)
                         + " FROM system_calibrations ON CONFLICT DO NOTHING")


def _migrate_to_5(con: duckdb.DuckDBPyConnection) -> None:
    """Version 5 keeps every gate in one table: each system gate (a cascade, an estimator chosen) moves from
    `system_calibrations` into `calibrations` — its id, and so its events, MLflow versions and exports, unchanged —
    and the old table is dropped. An id both tables hold stops it (nothing changes): the old row is never dropped
    unmoved."""
    _add_missing(con)
    if _stored_columns(con, "system_calibrations"):
        shared = [gid for (gid,) in con.sql("SELECT s.calibration_id FROM system_calibrations s JOIN calibrations c "
                                            "USING (calibration_id) ORDER BY 1").fetchall()]
        if shared:
            raise StoreError(f"calibration_id = {shared[0]!r}: both a gate and a system gate have it "
                             f"({len(shared)} such id(s)); the store cannot move its system gates into one table — "
                             "delete one of the two rows (nothing was changed)")
        con.execute(_V4_SYSTEM_GATES_MOVE)
        con.execute("DROP TABLE system_calibrations")


def _migrate_to_6(con: duckdb.DuckDBPyConnection) -> None:
    """Version 6 marks when the store's gates started being certified by today's rules (a record whose label
    never came counts as an error; `queries.made_before_rules`): a gate made before it that no longer re-certifies
    was certified by an earlier version, not edited, and the surfaces say so. Gate events get typed reasons
    (`reason_code`, `caused_at`): the codes of events stored before are read once here from their sentences'
    markers, and a flag an ingest's relabel or replace raised gets that ingest's stamp from its sentence; from
    then on no code reads a sentence."""
    _add_missing(con)
    for marker, code in _REASON_MARKERS:
        con.execute("UPDATE gate_events SET reason_code = ? WHERE reason_code IS NULL AND starts_with(reason, ?)",
                    [code, marker])
    con.execute(_LEGACY_FLAG_CAUSES)


_LEGACY_STAMP = "strftime(timezone('UTC', i.started_at), '%Y-%m-%d %H:%M') || ' UTC;%'"
#: a flag an ingest's relabel or replace raised, stored before `caused_at`: its ingest, by the stamp its words give
_LEGACY_FLAG_CAUSES = ("UPDATE gate_events g SET caused_at = i.started_at FROM ingests i WHERE g.reason_code = "
                       "'flagged' AND g.caused_at IS NULL AND (g.reason LIKE '% relabelled by % at ' || "
                       + _LEGACY_STAMP + " OR g.reason LIKE '% rewritten by % at ' || " + _LEGACY_STAMP + ")")
#: the sentence markers of events stored before reason codes (`serving_state.REASON_CODES`), read once by
#: `_migrate_to_6`
_REASON_MARKERS = (("flagged: ", "flagged"), ("alerted: ", "alerted"), ("without guarantee: ", "without guarantee"),
                   ("confirmed: ", "confirmed"))


# MIGRATIONS[v] upgrades a file from version v - 1 to v. Additive changes (a new nullable column or table in
# cic.schema) need no entry: `_add_missing` applies them on every read-write open.
MIGRATIONS: dict[int, Callable[[duckdb.DuckDBPyConnection], None]] = {1: _migrate_to_1, 2: _migrate_to_2,
                                                                      3: _migrate_to_3, 4: _migrate_to_4,
                                                                      5: _migrate_to_5, 6: _migrate_to_6}


def _stored_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The file's schema version; 0 for cic tables without a version table; None for an empty database."""
    tables = {name for (name,) in con.sql("SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'main'").fetchall()}
    if "schema_version" in tables:
        version = _scalar(con, "SELECT max(version) FROM schema_version")
        return int(version or 0)
    return 0 if tables & set(schema.TABLES) else None


def _check_kinds(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Every cic table is a table: a view of the same name (a crafted file) would answer reads with anything."""
    kinds = dict(con.sql("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'main'")
                 .fetchall())
    for name in ("schema_version", *schema.TABLES):
        if kinds.get(name, "BASE TABLE") != "BASE TABLE":
            raise StoreError(f"db = {str(path)!r}: {name} is a {kinds[name].lower()}, not a table; this file was not "
                             "written by cic (or was edited by hand) — use a store cic wrote")


def _check_types(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Every stored column has the type cic.schema gives it (a changed type needs a numbered migration)."""
    for spec in schema.TABLES.values():
        stored = _stored_columns(con, spec.name)
        for column, dtype in spec.columns.items():
            found = _SQL_TYPE_NAMES.get(stored.get(column, ""), stored.get(column))
            if found is not None and found != duckdb_type(dtype):
                raise StoreError(f"db = {str(path)!r}: column {spec.name}.{column} is {found} in the file but "
                                 f"{duckdb_type(dtype)} in cic.schema; a migration is needed "
                                 "(cic.store.database.MIGRATIONS)")


def _add_missing(con: duckdb.DuckDBPyConnection) -> None:
    """Create tables and add nullable columns that cic.schema has and the file lacks."""
    for spec in schema.TABLES.values():
        stored = _stored_columns(con, spec.name)
        if not stored:
            con.execute(create_table_sql(spec))
            continue
        for column, dtype in spec.columns.items():
            if column not in stored:
                con.execute(f"ALTER TABLE {spec.name} ADD COLUMN {column} {duckdb_type(dtype)}")


def _prepare(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> int:
    """Bring the file to SCHEMA_VERSION (migrations in one transaction), or explain why it cannot be."""
    _check_kinds(con, path)
    version = _stored_version(con)
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(f"db = {str(path)!r} has schema version {version}, newer than this cic "
                         f"({SCHEMA_VERSION}); upgrade cic to use it")
    if read_only:
        if version is None:
            raise StoreError(f"db = {str(path)!r} holds no cic tables; open it for writing first")
        if version < SCHEMA_VERSION or any(set(spec.columns) - set(_stored_columns(con, spec.name))
                                           for spec in schema.TABLES.values()):
            raise StoreError(f"db = {str(path)!r} has an older layout (schema version {version}); open it once "
                             "without read_only to migrate it")
        _check_types(con, path)
        return version
    con.begin()
    try:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
                    "applied_at TIMESTAMPTZ NOT NULL)")
        start = SCHEMA_VERSION if version is None else version
        for step in range(start + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[step](con)
        _add_missing(con)
        _check_types(con, path)
        if version != SCHEMA_VERSION:
            con.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                        [SCHEMA_VERSION, datetime.now(UTC)])
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return SCHEMA_VERSION


# ----------------------------------------------------------------------------------------------------------
# Batches


def as_table_frame(table: str, batch: pl.DataFrame | pa.Table) -> pl.DataFrame:
    """A batch (polars or Arrow) checked and cast to the table's layout, de-duplicated on its key (last row
    wins); `created_at` is stamped where absent. Workers may call it to fail early; `upsert` always does."""
    spec = _table_spec(table)
    frame = batch if isinstance(batch, pl.DataFrame) else pl.from_arrow(batch)
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"{table}: expected a polars DataFrame or Arrow table, got {type(batch).__name__}")
    for column in (CREATED_AT, *spec.added_later):
        if column in spec.columns and column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=spec.columns[column]).alias(column))
    missing = [c for c in spec.columns if c not in frame.columns]
    if missing:
        raise UserError(f"{table} rows lack column(s) {', '.join(missing)}; expected {', '.join(spec.columns)}")
    casts = []
    for column, dtype in spec.columns.items():
        try:
            casts.append(frame.get_column(column).cast(dtype))
        except pl.exceptions.PolarsError as exc:
            raise UserError(f"{table}.{column}: cannot store {frame.schema[column]} values as {dtype}: "
                             f"{str(exc).splitlines()[0]}") from None
    frame = pl.DataFrame(casts)
    if CREATED_AT in spec.columns:
        frame = frame.with_columns(pl.col(CREATED_AT).fill_null(datetime.now(UTC)))
    for column in spec.key:
        nulls = frame.get_column(column).is_null()
        if nulls.any():
            row = int(nulls.arg_true()[0])
            raise UserError(f"{table}.{column} is null at row {row}; key columns ({', '.join(spec.key)}) "
                             "must be set")
    return frame.unique(subset=list(spec.key), keep="last", maintain_order=True)


def _where(spec: schema.TableSpec, filters: Mapping[str, Any], alias: str = "") -> tuple[str, list[Any]]:
    """A WHERE clause of equality filters (a list/tuple/set value means IN; None means IS NULL)."""
    clauses, params = [], []
    for column, value in filters.items():
        if column not in spec.columns:
            raise UserError(f"{spec.name} has no column {column!r}; columns are {', '.join(spec.columns)}")
        name = f"{alias}{column}"
        if value is None:
            clauses.append(f"{name} IS NULL")
        elif isinstance(value, list | tuple | set | frozenset):
            clauses.append(f"list_contains(?, {name})")
            params.append(list(value))
        else:
            clauses.append(f"{name} = ?")
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


# ----------------------------------------------------------------------------------------------------------
# The store


class Store:
    """A DuckDB file in the cic layout. Open with `Store.open(path)`; use as a context manager."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool, version: int) -> None:
        self._con = con
        self.path = path
        self.read_only = read_only
        self.schema_version = version
        self._in_transaction = False

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False, wait_s: float = 0.0,
             waiting: Callable[[str], None] | None = None) -> Store:
        """Open (or create) a store; migrates an older file. Raises `StoreLockedError` when another process
        holds the file (after retrying with backoff for up to `wait_s` seconds; `waiting` is told once, when the
        wait begins) and `NotADuckDBFileError` for a file that is not a DuckDB database. Writers that run for long
        open per batch with a wait, so readers and other flows get the file between batches."""
        import time

        deadline = time.monotonic() + wait_s
        pause = 0.05
        while True:
            try:
                return cls._open_once(path, read_only=read_only)
            except StoreLockedError:
                if time.monotonic() + pause > deadline:
                    raise
                if waiting is not None and pause == 0.05:
                    waiting(f"db = {str(path)!r} is held by another process (a writer between batches); waiting "
                            f"up to {wait_s:g} s")  # said once
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    @classmethod
    def _open_once(cls, path: str | Path, *, read_only: bool) -> Store:
        p = Path(path).expanduser()
        if not read_only and not p.parent.exists():
            raise StoreError(f"db = {str(p)!r}: directory {str(p.parent)!r} does not exist")
        import duckdb

        try:
            con = _connect(p, read_only)
        except duckdb.Error as exc:  # corrupted blocks, a damaged WAL, ...: never a traceback, never a write
            raise DamagedStoreError(_damaged(p, exc)) from None
        try:
            version = _prepare(con, p, read_only)
        except duckdb.Error as exc:
            con.close()
            raise DamagedStoreError(_damaged(p, exc)) from None
        except BaseException:
            con.close()
            raise
        return cls(con, p, read_only, version)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """Close the file; a DuckDB error from any query made in the block that says the file is damaged, or
        that it could not grow (disk full, a file-size limit), becomes one `StoreError` naming the file and what to
        do (every command reads and writes through here)."""
        if exc is None or isinstance(exc, StoreError) or not (is_no_space(exc) or is_damage(exc)):
            self.close()
            return
        with contextlib.suppress(Exception):  # a connection DuckDB invalidated may fail to close as well
            self.close()
        if is_no_space(exc):
            raise StoreError(_no_space(self.path, exc)) from None
        raise DamagedStoreError(_damaged_in_query(self.path, exc)) from None

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({str(self.path)!r}, {mode}, schema version {self.schema_version})"

    # -- writing ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def scratch(self, purpose: str) -> Iterator[Path]:
        """A temporary directory beside the store for one write (`purpose`: ingest, import), removed when it ends;
        the ones a killed process left behind (kill -9 skips every cleanup) are removed first — this process holds
        the store's only write connection, so none of them is in use."""
        import shutil
        import tempfile

        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only; open it without read_only to write")
        prefix = f".cic-scratch-{purpose}-{self.path.name}-"
        for stale in self.path.parent.glob(prefix + "*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=prefix, dir=self.path.parent) as tmp:
            yield Path(tmp)

    @contextlib.contextmanager
    def memory_limit(self, limit: str) -> Iterator[Store]:
        """Run a block under a DuckDB memory limit such as '1GB' (it spills to disk beyond it where it can),
        restoring the previous limit after."""
        if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)", limit):
            raise UserError(f"memory limit = {limit!r}: expected a size such as 512MB or 1GB")
        previous = self._con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
        self._con.execute("SET memory_limit = ?", [limit])
        import duckdb

        try:
            yield self
        except BaseException:
            with contextlib.suppress(duckdb.Error):  # a connection DuckDB invalidated refuses even this
                self._con.execute("SET memory_limit = ?", [previous])
            raise
        self._con.execute("SET memory_limit = ?", [previous])

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Store]:
        """Group writes: all of them are stored, or (on any exception) none."""
        if self._in_transaction:
            yield self
            return
        import duckdb

        self._con.begin()
        self._in_transaction = True
        try:
            yield self
            self._con.commit()
        except BaseException:
            with contextlib.suppress(duckdb.Error):  # a failed commit (no room to checkpoint) may refuse a rollback
                self._con.rollback()
            raise
        finally:
            self._in_transaction = False

    def upsert(self, table: str, frame: pl.DataFrame | pa.Table) -> int:
        """Insert rows, replacing those whose natural key exists (`created_at` keeps its first value).

        Idempotent: writing the same rows again changes nothing. The batch is checked and de-duplicated on its
        key (last row wins) before anything is written; a bad batch raises ValueError and writes nothing.
        Returns the number of distinct rows written.
        """
        return self._write(table, as_table_frame(table, frame))

    def upsert_batches(self, table: str, batches: Iterable[pl.DataFrame | pa.Table]) -> int:
        """Write the batches workers returned (polars or Arrow) as one upsert, in one transaction; every batch
        is checked before anything is written, and a key repeated across batches keeps its last row."""
        frames = [as_table_frame(table, b) for b in batches]
        if not frames:
            return 0
        merged = pl.concat(frames, how="vertical")
        return self._write(table, merged.unique(subset=list(schema.TABLES[table].key), keep="last",
                                                maintain_order=True) if len(frames) > 1 else merged)

    def _write(self, table: str, rows: pl.DataFrame) -> int:
        """INSERT ... ON CONFLICT DO UPDATE of checked, key-unique rows (see `as_table_frame`)."""
        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only; open it without read_only to write")
        if rows.height == 0:
            return 0
        spec = schema.TABLES[table]
        updated = [c for c in spec.columns if c not in spec.key and c != CREATED_AT]
        action = ("DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in updated)) if updated else "DO NOTHING"
        name = f"cic_batch_{next(_batch_names)}"
        self._con.register(name, rows.to_arrow())
        import duckdb

        try:
            with self.transaction():
                self._con.execute(f"INSERT INTO {table} ({', '.join(spec.columns)}) SELECT "
                                  f"{', '.join(spec.columns)} FROM {name} ON CONFLICT ({', '.join(spec.key)}) "
                                  f"{action}")
        except duckdb.IOException as exc:  # a full disk, a file-size limit: the transaction rolled back
            raise StoreError(f"db = {str(self.path)!r}: writing {rows.height} {table} rows failed "
                             f"({' '.join(str(exc).split())[:200]}); nothing of this batch was written and earlier "
                             "rows are intact — free space and rerun (it resumes)") from None
        finally:
            self._unregister(name)
        return rows.height

    def _unregister(self, name: str) -> None:
        """Drop a registered batch; in a transaction a failed statement aborted, DuckDB refuses even that, and
        its refusal must not hide the error that aborted it (a damaged block, a full disk)."""
        import duckdb

        with contextlib.suppress(duckdb.TransactionException):
            self._con.unregister(name)

    def register_run(self, model: str, dataset: str, split: str, prompt_id: str,
                     generation_config: Mapping[str, Any], *, experiment_prefix: str | None = None) -> str:
        """Record a generation run (idempotent) and return its `run_key`: the stored run with the same model,
        dataset, split, prompt and generation_config if there is one. `experiment_prefix` is the MLflow prefix of
        the config that asked for it, so `cic log` logs where `cic run` would have."""
        for name, value in (("model", model), ("dataset", dataset), ("split", split), ("prompt_id", prompt_id)):
            if not isinstance(value, str) or not value:
                raise UserError(f"{name} = {value!r}: must be a non-empty string")
        config = schema.canonical_json(generation_config)
        same = self.sql("SELECT run_key FROM runs WHERE model = ? AND dataset = ? AND split = ? AND prompt_id = ? "
                        "AND generation_config = ? ORDER BY created_at, run_key LIMIT 1",
                        [model, dataset, split, prompt_id, config])
        # the run that made these generations, if stored (its key may predate the current key formula)
        key = str(same[0][0]) if same else schema.run_key(model, dataset, split, prompt_id, generation_config)
        self.upsert("runs", pl.DataFrame({
            "run_key": [key], "model": [model], "dataset": [dataset], "split": [split], "prompt_id": [prompt_id],
            "generation_config": [config],
            "experiment_prefix": pl.Series([experiment_prefix], dtype=pl.String)}))
        return key

    def set_unanswered(self, run_key: str, question_ids: Sequence[str], *, moved: int | None = None) -> int:
        """Record how many of a run's questions still have no answer after an answer stage (and, given, how many of
        its requests moved to another replica in it); returns the unanswered count."""
        unanswered = len(self.missing_questions(run_key, question_ids))
        self._con.execute("UPDATE runs SET unanswered = ?, moved_requests = coalesce(?, moved_requests) WHERE "
                          "run_key = ?", [unanswered, moved, run_key])
        return unanswered

    # -- reading ---------------------------------------------------------------------------------------------

    def read(self, table: str, *, ordered: bool = True, **equals: Any) -> pl.DataFrame:
        """Rows of a table matching the equality filters (list value = any of), ordered by the natural key
        (`ordered=False` skips the sort: about 4x faster on 10^6 rows, in storage order)."""
        spec = _table_spec(table)
        where, params = _where(spec, equals)
        order = f" ORDER BY {', '.join(spec.key)}" if ordered else ""
        frame = self._con.sql(f"SELECT {', '.join(spec.columns)} FROM {table}{where}{order}", params=params).pl()
        return schema.conform(frame, spec)

    def count(self, table: str, **equals: Any) -> int:
        spec = _table_spec(table)
        where, params = _where(spec, equals)
        n = _scalar(self._con, f"SELECT count(*) FROM {table}{where}", params)
        return int(n)

    def counts(self) -> dict[str, int]:
        """Row count of every table."""
        return {name: self.count(name) for name in schema.TABLES}

    def missing_questions(self, run_key: str, question_ids: Sequence[str], *, table: str = "generations",
                          min_rows: int = 1, **equals: Any) -> list[str]:
        """The question ids (in the given order) with fewer than `min_rows` rows for `run_key` in `table`.

        Resume a run by asking only for these: e.g. generations with `min_rows=K + 1` (greedy + K samples),
        scores with `estimator=...`, labels with `criterion=...`.
        """
        spec = _table_spec(table)
        if "run_key" not in spec.columns or "question_id" not in spec.columns:
            raise ValueError(f"table = {table!r}: has no run_key/question_id columns")
        if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
            raise ValueError(f"min_rows = {min_rows!r}: must be a positive integer")
        ids = pl.DataFrame({"question_id": [str(q) for q in question_ids]}, schema={"question_id": pl.String})
        if ids.height == 0:
            return []
        ids = ids.with_row_index("position")
        where, params = _where(spec, {"run_key": run_key, **equals})
        name = f"cic_ids_{next(_batch_names)}"
        self._con.register(name, ids.to_arrow())
        try:
            done = self._con.sql(
                f"SELECT i.question_id FROM {name} i LEFT JOIN (SELECT question_id, count(*) AS n FROM {table}"
                f"{where} GROUP BY question_id) d USING (question_id) WHERE coalesce(d.n, 0) < ? "
                f"ORDER BY i.position", params=[*params, min_rows]).fetchall()
        finally:
            self._unregister(name)
        return [q for (q,) in done]

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a parameterised read query (for pipeline stages that need a grouped or joined read)."""
        if not query.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ValueError(f"query = {query[:60]!r}: only SELECT / WITH reads are allowed here")
        return self._con.sql(query, params=list(params)).fetchall()

    def sql_frame(self, query: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        """`sql` as a polars frame (a joined or grouped read too large for Python tuples)."""
        if not query.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ValueError(f"query = {query[:60]!r}: only SELECT / WITH reads are allowed here")
        result = pl.from_arrow(self._con.sql(query, params=list(params)).to_arrow_table())
        assert isinstance(result, pl.DataFrame)
        return result

    def upsert_select(self, table: str, query: str, params: Sequence[Any] = ()) -> int:
        """Upsert the rows of a SELECT whose columns are named as the table's (matched by name, not position),
        key-unique (a bulk write from staged Parquet files: DuckDB streams it, nothing passes through Python);
        `created_at` keeps its first value, as in `upsert`. Returns the rows the SELECT produced."""
        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only; open it without read_only to write")
        spec = _table_spec(table)
        updated = [c for c in spec.columns if c not in spec.key and c != CREATED_AT]
        action = ("DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in updated)) if updated else "DO NOTHING"
        import duckdb

        try:
            with self.transaction():
                count = self._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM ({query}) "
                                          f"ON CONFLICT ({', '.join(spec.key)}) {action}", list(params)).fetchall()
        except duckdb.IOException as exc:  # a full disk, a file-size limit: the transaction rolled back
            raise StoreError(f"db = {str(self.path)!r}: writing {table} rows failed "
                             f"({' '.join(str(exc).split())[:200]}); nothing of this write was stored and earlier "
                             "rows are intact — free space and rerun") from None
        return int(count[0][0]) if count else 0

    def find_runs(self, model: str, dataset: str, **equals: Any) -> pl.DataFrame:
        """Runs of a model on a dataset (optionally also by split, prompt_id, run_key)."""
        return self.read("runs", model=model, dataset=dataset, **equals)

    def calibration_frame(self, model: str, dataset: str, estimator: str, criterion: str, *,
                          run_key: str | None = None, split: str | None = None, prompt_id: str | None = None,
                          allow_partial: bool = False) -> pl.DataFrame:
        """(question_id, score, error) of one run, error = 1 - aligned: the pairs `cic.calibrate` takes.

        The run is the one of `model` on `dataset` (narrowed by split/prompt_id/run_key); several matching runs
        (e.g. different generation configs) are an error listing them, never mixed. A question with a score
        but no label (or the reverse) is an error unless `allow_partial=True`, which drops it.
        """
        filters = {k: v for k, v in (("run_key", run_key), ("split", split), ("prompt_id", prompt_id)) if v}
        runs = self.find_runs(model, dataset, **filters)
        wanted = ", ".join(f"{k}={v!r}" for k, v in {"model": model, "dataset": dataset, **filters}.items())
        if runs.height == 0:
            stored = self.read("runs").select("model", "dataset").unique().rows()
            raise UserError(f"no run with {wanted}; stored (model, dataset) pairs: {stored or 'none'}")
        if runs.height > 1:
            listing = "; ".join(f"run_key={r['run_key']} (split={r['split']}, prompt_id={r['prompt_id']}, "
                                f"generation_config={r['generation_config']})" for r in runs.iter_rows(named=True))
            raise UserError(f"{runs.height} runs match {wanted}; pass run_key= to choose one: {listing}")
        key = runs.get_column("run_key")[0]
        pairs = self._con.sql(
            "WITH s AS (SELECT question_id, value FROM scores WHERE run_key = ? AND estimator = ?), "
            "l AS (SELECT question_id, aligned FROM labels WHERE run_key = ? AND criterion = ?) "
            "SELECT question_id, s.value AS score, l.aligned AS aligned FROM s FULL OUTER JOIN l USING (question_id) "
            "ORDER BY question_id", params=[key, estimator, key, criterion]).pl()
        for column, table, field, value in (("score", "scores", "estimator", estimator),
                                            ("aligned", "labels", "criterion", criterion)):
            if pairs.get_column(column).is_null().all():
                stored = self._con.sql(f"SELECT DISTINCT {field} FROM {table} WHERE run_key = ? ORDER BY 1",
                                       params=[key]).fetchall()
                raise UserError(f"run {key} has no {table} for {field}={value!r}; stored {field} values: "
                                 f"{[v for (v,) in stored]}")
        incomplete = pairs.filter(pl.col("score").is_null() | pl.col("aligned").is_null())
        if incomplete.height and not allow_partial:
            no_label = incomplete.filter(pl.col("aligned").is_null()).height
            raise UserError(
                f"run {key}: {no_label} question(s) have a {estimator!r} score but no {criterion!r} label and "
                f"{incomplete.height - no_label} have a label but no score (e.g. "
                f"{incomplete.get_column('question_id').head(3).to_list()}); finish the run or pass "
                "allow_partial=True to calibrate on the complete pairs only")
        return pairs.filter(pl.col("score").is_not_null() & pl.col("aligned").is_not_null()).select(
            "question_id", "score", (~pl.col("aligned")).cast(pl.Int8).alias("error"))

    # -- moving tables between machines --------------------------------------------------------------------

    def export(self, table: str, path: str | Path, **equals: Any) -> int:
        """Write a table (or the rows matching the filters) to Parquet; returns the row count.

        The file records its table name, so `import_` needs no table argument.
        """
        import pyarrow.parquet as pq

        target = Path(path).expanduser()
        if target.suffix.lower() not in (".parquet", ".pq"):
            raise UserError(f"path = {str(target)!r}: give a .parquet file name")
        if not target.parent.exists():
            raise UserError(f"path = {str(target)!r}: directory {str(target.parent)!r} does not exist")
        arrow = self.read(table, **equals).to_arrow()
        arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), b"cic.table": table.encode(),
                                               b"cic.schema_version": str(self.schema_version).encode()})
        from cic.store.outputs import atomic_output

        with atomic_output(Path(os.path.realpath(target)) if target.is_symlink() else target, "path") as partial:
            pq.write_table(arrow, partial)
        return arrow.num_rows

    def import_(self, path: str | Path, table: str | None = None) -> tuple[str, int]:
        """Upsert a Parquet file (an `export`, or any file with the table's columns), checked first
        (`cic.store.imports`); returns (table, rows)."""
        from cic.store.imports import checked_import

        name, arrow = checked_import(path, table, schema.TABLES)
        return name, self.upsert(name, arrow)


# ----------------------------------------------------------------------------------------------------------
# Undoing an unfinished ingest (`cic ingest --abandon`)


ABANDON_STEPS = 18  # the statements `delete_ingest_rows` runs, for its progress

#: how `delete_ingest_rows` puts back a record field an abandoned ingest replaced (`record_events`): the table,
#: the column, its old value from the event's text, and how the row is found from the event `e`
RESTORES = (
    ("generations", "text", "e.old_value", "t.run_key = e.run_key AND t.question_id = e.question_id AND "
                                           "t.sample_index = 0", "answer"),
    ("observations", "observed_at", "CAST(e.old_value AS TIMESTAMPTZ)",
     "t.run_key = e.run_key AND t.question_id = e.question_id", "timestamp"),
    ("scores", "value", "CAST(e.old_value AS DOUBLE)", "t.run_key = e.run_key AND t.question_id = e.question_id AND "
                                                       "e.field = 'score:' || t.estimator", None),
    ("questions", "question", "e.old_value", "t.question_id = e.question_id AND EXISTS (SELECT 1 FROM runs r WHERE "
                                             "r.run_key = e.run_key AND t.dataset = r.dataset AND "
                                             "t.split = 'production:' || r.model)",
     "question"),
    ("questions", "answer", "e.old_value", "t.question_id = e.question_id AND EXISTS (SELECT 1 FROM runs r WHERE "
                                           "r.run_key = e.run_key AND t.dataset = r.dataset AND "
                                           "t.split = 'production:' || r.model)",
     "gold"),
)


def _as_event_text(column: str) -> str:
    """A stored column as `record_events` writes its values (`cic.store.ingest_queries.changed_records`)."""
    if column == "observed_at":
        return "strftime(t.observed_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ')"
    return f"CAST(t.{column} AS VARCHAR)"


def delete_ingest_rows(store: Store, *, stamp: datetime, digest: str, records: Sequence[str] | None,
                       labels: Sequence[str] | None, step: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Delete what an unfinished ingest (`digest`, stamped `stamp`) stored first, so it can be abandoned; rows an
    earlier ingest stored stay, and so do rows another ingest (done or unfinished) wrote since — a later complete
    file holds them; relabelled labels and replaced record fields (`record_events`) get their old value back unless
    another ingest rewrote them, and the gate flags its changes raised go. Runs inside the caller's transaction.
    `records` / `labels`: its staged Parquet files, narrowing the rows to its keys (None: gone, the stamp alone
    decides). `step` hears (statements done, ABANDON_STEPS) after each one: on 10^6 records each takes tens of
    seconds. Returns rows deleted (or restored) per table."""
    if store.read_only:
        raise StoreError(f"{store!r} was opened read-only; open it without read_only to write")
    abandon = _Abandon(store._con, stamp, digest, step)
    abandon.mark(records)
    try:
        abandon.delete_records()
        abandon.restore()
        abandon.delete_labels(labels)
        abandon.reattribute()
    finally:
        abandon.con.execute("DROP TABLE IF EXISTS cic_abandoned")
    return abandon.done


class _Abandon:
    """One abandon's statements (`delete_ingest_rows`), each counted for its progress; `done`: rows per table."""

    KEPT = "NOT (ingest IS NOT NULL AND ingest <> ?)"  # another ingest wrote the row since: it holds it

    def __init__(self, con: duckdb.DuckDBPyConnection, stamp: datetime, digest: str,
                 step: Callable[[int, int], None] | None) -> None:
        self.con, self.stamp, self.digest, self.step = con, stamp, digest, step
        self.finished = 0
        self.done: dict[str, int] = {}

    def execute(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        result = self.con.execute(sql, list(params)).fetchall()
        self.finished += 1
        if self.step is not None:
            self.step(self.finished, ABANDON_STEPS)
        return result

    def run(self, sql: str, params: Sequence[Any]) -> int:
        result = self.execute(sql, params)
        return int(result[0][0]) if result else 0

    def mark(self, records: Sequence[str] | None) -> None:
        """The records it stored that no other ingest holds, into a temporary table (`cic_abandoned`)."""
        abandoned = ("CREATE OR REPLACE TEMP TABLE cic_abandoned AS SELECT run_key, question_id FROM observations "
                     f"WHERE created_at = ? AND {self.KEPT}")
        if records is None:
            self.execute(abandoned, [self.stamp, self.digest])
        elif records:
            self.execute(abandoned + " AND (run_key, question_id) IN (SELECT run_key, question_id FROM "
                         "read_parquet(?))", [self.stamp, self.digest, list(records)])
        else:
            self.execute(abandoned + " AND false", [self.stamp, self.digest])

    def delete_records(self) -> None:
        """Its records' questions, generations and scores."""
        self.done["questions"] = self.run(
            "DELETE FROM questions q WHERE EXISTS (SELECT 1 FROM cic_abandoned a JOIN runs r USING (run_key) WHERE "
            "q.dataset = r.dataset AND q.split = 'production:' || r.model AND q.question_id = a.question_id)", [])
        for table in ("generations", "scores"):
            self.done[table] = self.run(f"DELETE FROM {table} WHERE (run_key, question_id) IN "
                                        "(SELECT run_key, question_id FROM cic_abandoned)", [])

    def restore(self) -> None:
        """The labels it relabelled and the record fields it replaced, back to their old values (unless another
        ingest rewrote them since), and their events gone."""
        self.done["labels restored"] = self.run(
            "UPDATE labels l SET aligned = e.old_aligned, value = CASE WHEN l.value = CAST(e.new_aligned AS DOUBLE) "
            "THEN CAST(e.old_aligned AS DOUBLE) ELSE l.value END FROM label_events e WHERE e.created_at = ? AND "
            "l.run_key = e.run_key AND l.question_id = e.question_id AND l.criterion = e.criterion AND "
            "l.aligned IS NOT DISTINCT FROM e.new_aligned AND NOT (l.ingest IS NOT NULL AND l.ingest <> ?)",
            [self.stamp, self.digest])
        restored = 0
        for table, column, old, where, field in RESTORES:  # records it replaced that nothing rewrote since
            restored += self.run(
                f"UPDATE {table} t SET {column} = {old} FROM record_events e WHERE e.created_at = ? AND "
                + (f"e.field = '{field}' AND " if field else "e.field LIKE 'score:%' AND ")
                + f"{where} AND {_as_event_text(column)} IS NOT DISTINCT FROM e.new_value AND EXISTS (SELECT 1 "
                "FROM observations o WHERE o.run_key = e.run_key AND o.question_id = e.question_id AND o.ingest = ?)",
                [self.stamp, self.digest])
        self.done["records restored"] = restored
        self.done["record_events"] = self.run("DELETE FROM record_events WHERE created_at = ?", [self.stamp])

    def delete_labels(self, labels: Sequence[str] | None) -> None:
        """Its labels, their events, and the gate flags its relabels or replacements raised (by their cause,
        `gate_events.caused_at`) where nothing happened to the gate since."""
        where, params = f"created_at = ? AND {self.KEPT}", [self.stamp, self.digest]
        if labels is not None:
            where += (" AND (run_key, question_id, criterion) IN (SELECT run_key, question_id, criterion "
                      "FROM read_parquet(?))") if labels else " AND false"
            params += [list(labels)] if labels else []
        self.done["labels"] = self.run(f"DELETE FROM labels WHERE ({where}) OR (run_key, question_id) IN "
                                       "(SELECT run_key, question_id FROM cic_abandoned)", params)
        self.done["label_events"] = self.run("DELETE FROM label_events WHERE created_at = ?", [self.stamp])
        self.done["gate_events"] = self.run(
            "DELETE FROM gate_events g WHERE g.caused_at = ? AND g.created_at = (SELECT max(created_at) FROM "
            "gate_events h WHERE h.calibration_id = g.calibration_id)", [self.stamp])

    def reattribute(self) -> None:
        """Its records' observations gone; rows it rewrote that stay, written last by their first ingest; the
        production runs it registered that hold nothing now gone."""
        self.done["observations"] = self.run("DELETE FROM observations WHERE (run_key, question_id) IN "
                                             "(SELECT run_key, question_id FROM cic_abandoned)", [])
        for table in ("labels", "observations"):
            self.execute(f"UPDATE {table} t SET ingest = (SELECT min(i.digest) FROM ingests i WHERE i.started_at = "
                         "t.created_at AND i.digest <> ?) WHERE t.ingest = ?", [self.digest, self.digest])
        self.done["runs"] = self.run(
            "DELETE FROM runs r WHERE r.split = 'production' AND r.created_at >= ? AND " + " AND ".join(
                f"NOT EXISTS (SELECT 1 FROM {t} x WHERE x.run_key = r.run_key)"
                for t in ("observations", "generations", "scores", "labels", "calibrations")), [self.stamp])
