"""Opening a store file: a foreign file, a directory, a lock another process holds, a damaged block or a full disk
each become one line naming the file and what to do."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

from cic.store.layout import _CONNECT_CONFIG, NotADuckDBFileError, StoreError, StoreLockedError


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
