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
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.store.layout import (
    CREATED_AT,
    SCHEMA_VERSION,
    DamagedStoreError,
    NotADuckDBFileError,
    StoreError,
    StoreLockedError,
    _batch_names,
    _table_spec,
    create_table_sql,
    duckdb_type,
)
from cic.store.migrations import _prepare, _scalar
from cic.store.opening import _connect, _damaged, _damaged_in_query, _no_space, is_damage, is_no_space

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

__all__ = ["CREATED_AT", "SCHEMA_VERSION", "DamagedStoreError", "NotADuckDBFileError", "Store", "StoreError",
           "StoreLockedError", "as_table_frame", "create_table_sql", "duckdb_type"]


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
        import duckdb

        given = {d[0] for d in self._con.execute(f"SELECT * FROM ({query}) LIMIT 0", list(params)).description}
        updated = [c for c in spec.columns if c not in spec.key and c != CREATED_AT  # a column added later that
                   and (c in given or c not in spec.added_later)]                  # the query lacks stays null
        action = ("DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in updated)) if updated else "DO NOTHING"
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
        from cic.llm.probes import parse_estimator

        if (parse_estimator(estimator) or ("",))[0] == "accuracy":  # its fit split is labelled and never scored
            pairs = pairs.filter(pl.col("score").is_not_null())
        incomplete = pairs.filter(pl.col("score").is_null() | pl.col("aligned").is_null())
        if incomplete.height and not allow_partial:
            no_label = incomplete.filter(pl.col("aligned").is_null()).height
            raise UserError(
                f"run {key}: {no_label} question(s) have a {estimator!r} score but no {criterion!r} label and "
                f"{incomplete.height - no_label} have a label but no score (e.g. "
                f"{incomplete.get_column('question_id').head(3).to_list()}); finish the run or pass "
                "allow_partial=True to calibrate on the complete pairs only")
        out = pairs.filter(pl.col("score").is_not_null() & pl.col("aligned").is_not_null()).select(
            "question_id", "score", (~pl.col("aligned")).cast(pl.Int8).alias("error"))
        from cic.store.probe_queries import refuse_fit_questions

        refuse_fit_questions(self, out.with_columns(run_key=pl.lit(key), estimator=pl.lit(estimator)))
        return out

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
