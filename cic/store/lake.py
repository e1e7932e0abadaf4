"""Delta Lake tables (`deltalake`, no DuckDB extension): open one with a one-line error, check its layout, append
with retried commits, and list and read the data files a store has not loaded yet.

A Delta commit is atomic: a writer killed before its commit leaves at most an orphan data file the log never
names, so a reader sees each appended batch whole or not at all. What a store has loaded is kept as the set of
data files it read (`lake_files`), so a load is exactly once whatever was compacted, retried or rerun.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from cic.store import Store

#: commit attempts of one append before it fails (concurrent writers: each conflict backs off and retries)
COMMIT_ATTEMPTS = 12


@dataclass(frozen=True)
class DataFile:
    """One data file of a table's current version: its path (Delta: relative to the table), its place in the
    table's history (Delta: when it was written, in ms; Iceberg: the sequence number that added it), rows."""

    path: str
    order: int
    rows: int


def _short(exc: BaseException) -> str:
    """The error's text on one line, without the terminal colours and arrows deltalake chains its causes with."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).replace("↳", ";")
    return " ".join(text.split())[:240]


#: URI schemes deltalake reads and writes (object stores and the local file system)
SCHEMES = ("file", "s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "hdfs", "memory")


def table_uri(uri: str | Path, field: str = "table") -> str:
    """A local path made absolute (a relative path would name another table from another directory); a URI
    with a known scheme (s3://, abfss://, gs://, file://) as given; anything else refused naming `field`."""
    text = str(uri).strip()
    if not text:
        raise UserError(f"{field} = {str(uri)!r}: give the path or URI of a Delta table")
    if "://" not in text:
        return str(Path(text).expanduser().resolve())
    scheme, _, rest = text.partition("://")
    if scheme.lower() not in SCHEMES or not rest.strip("/"):
        raise UserError(f"{field} = {str(uri)!r}: not a Delta table URI (schemes: {', '.join(SCHEMES)})")
    return text


def open_table(uri: str | Path, field: str, *, version: int | None = None) -> DeltaTable:
    """The Delta table at `uri` (at `version`, else the newest), or one line naming `field` and what is wrong."""
    table = find_table(uri, field, version=version)
    if table is None:
        raise UserError(f"{field} = {str(uri)!r}: no Delta table there")
    return table


def find_table(uri: str | Path, field: str, *, version: int | None = None) -> DeltaTable | None:
    """The Delta table at `uri`, None where there is none, or one line naming `field` when it cannot be read."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    where = table_uri(uri, field)
    if "://" not in where and Path(where).exists() and not Path(where).is_dir():
        raise UserError(f"{field} = {str(uri)!r}: is a file, not a Delta table (a directory with _delta_log)")
    try:
        return DeltaTable(where, version=version)
    except TableNotFoundError:
        return None
    except Exception as exc:  # an unreachable store, a version the log no longer holds, a damaged log
        what = f"version {version} cannot be read" if version is not None else "cannot be read"
        raise UserError(f"{field} = {str(uri)!r}: {what} ({type(exc).__name__}: {_short(exc)})") from None


def arrow_schema(table: DeltaTable) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def check_layout(table: DeltaTable, expected: pa.Schema, field: str, uri: str | Path, what: str,
                 optional: Iterable[str] = ()) -> None:
    """Refuse a table whose columns differ from `expected` (name and type), naming the first difference; it may
    lack the `optional` columns (added to the layout later)."""
    found, optional = arrow_schema(table), set(optional)
    for column in expected:
        if column.name not in found.names and column.name in optional:
            continue
        if column.name not in found.names:
            raise UserError(f"{field} = {str(uri)!r}: not {what}: it lacks column {column.name!r} (it has "
                            f"{', '.join(found.names[:12])})")
        have = found.field(column.name).type
        if not _same_type(have, column.type):
            raise UserError(f"{field} = {str(uri)!r}: not {what}: column {column.name!r} is {have}, not {column.type}")
    extra = [name for name in found.names if name not in expected.names]
    if extra:
        raise UserError(f"{field} = {str(uri)!r}: not {what}: unknown column(s) {', '.join(map(repr, extra[:5]))}")


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, counting string and large_string, binary and large_binary (and list element names) as one: Delta
    stores both alike."""
    import pyarrow as pa

    def norm(t: pa.DataType) -> Any:
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return pa.binary()
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return ("list", norm(t.value_type))
        return t

    return bool(norm(a) == norm(b))


def append(uri: str | Path, data: pa.Table, field: str, *, attempts: int = COMMIT_ATTEMPTS,
           backoff_s: float = 0.05, added_later: Iterable[str] = ()) -> int:
    """Append `data` in one commit (the table is created on the first append); a commit that conflicts with
    another writer's is retried with jittered exponential backoff. A table that lacks only `added_later` columns
    gains them (its older files read as null); any other difference is refused. Returns the table's version just
    after the commit (its own, or a concurrent writer's later one)."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError, SchemaMismatchError

    where, merge = table_uri(uri, field), False
    for attempt in range(attempts):
        try:
            write_deltalake(where, data, mode="append", schema_mode="merge" if merge else None)
            return int(open_table(where, field).version())
        except CommitFailedError as exc:
            if attempt == attempts - 1:
                raise UserError(f"{field} = {str(uri)!r}: commit failed {attempts} times ({_short(exc)})") from None
            time.sleep(backoff_s * 2 ** attempt * (0.5 + random.random()))
        except SchemaMismatchError as exc:
            if merge or not _lacks_only(where, data.schema, set(added_later), field):
                raise UserError(f"{field} = {str(uri)!r}: holds another layout ({_short(exc)})") from None
            merge = True  # the same commit again, adding the columns the table lacks
        except OSError as exc:
            raise UserError(f"{field} = {str(uri)!r}: cannot be written ({_short(exc)})") from None
    raise AssertionError("unreachable")


def _lacks_only(where: str, wanted: pa.Schema, columns: set[str], field: str) -> bool:
    """Whether the table at `where` has every column of `wanted` but some of `columns`, each of the same type."""
    found = arrow_schema(open_table(where, field))
    missing = [c.name for c in wanted if c.name not in found.names]
    return bool(missing) and set(missing) <= columns and len(found.names) + len(missing) == len(wanted.names) and all(
        _same_type(found.field(c.name).type, c.type) for c in wanted if c.name in found.names)


def data_files(table: DeltaTable) -> list[DataFile]:
    """The data files of the table's loaded version, oldest first (by write time, then path: a retried
    batch lands after the attempt it repeats)."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "modification_time", "num_records"])
    files = [DataFile(str(p), int(m), int(n or 0)) for p, m, n in zip(*actions.to_pydict().values(), strict=True)]
    return sorted(files, key=lambda f: (f.order, f.path))


@dataclass(frozen=True)
class LakeSource:
    """A table a store reads file by file (Delta here, Iceberg in `cic.store.iceberg`): the name `lake_files`
    knows it by, its current version, its columns, its data files and a reader of some of them."""

    key: str
    version: int
    columns: list[str]
    files: Callable[[], list[DataFile]]
    read: Callable[[Sequence[DataFile]], pa.Table]
    family: str = ""   # a name all its incarnations share (Iceberg: without the table's uuid); "" = the key


def delta_source(table: DeltaTable, field: str = "table") -> LakeSource:
    """An open Delta table as a source (`field` names it in a refusal)."""
    return LakeSource(table.table_uri, int(table.version()), list(arrow_schema(table).names),
                      lambda: data_files(table), lambda files: read_files(table, files, field))


def unloaded_files(store: Store, source: LakeSource, field: str, uri: str | Path) -> list[DataFile]:
    """The table's data files the store has not loaded (`lake_files`), oldest first; a table older than the
    version the store last read, or another incarnation of one it read (recreated, or replaced by another), is
    refused in one line."""
    loaded = store.sql("SELECT path, version FROM lake_files WHERE table_uri = ?", [source.key])
    newest = max((int(v) for _, v in loaded), default=-1)
    other = store.sql("SELECT table_uri FROM lake_files WHERE starts_with(table_uri, ?) AND table_uri <> ? LIMIT 1",
                      [source.family + "#", source.key]) if source.family else []
    if newest > source.version or other:
        seen = f"version {newest}" if newest > source.version else f"another table of that name ({other[0][0]})"
        raise UserError(f"{field} = {str(uri)!r}: the table is at version {source.version}, but this store read "
                        f"{seen}; it was recreated or replaced — load it into a new store, or delete its rows of "
                        "lake_files to read it from the start (re-sent rows change nothing)")
    paths = {p for p, _ in loaded}
    return [f for f in source.files() if f.path not in paths]


def read_files(table: DeltaTable, files: Sequence[DataFile], field: str = "table") -> pa.Table:
    """The rows of these data files of the table, in the given order, with the table's columns and types
    (partition columns filled from each file's partition values; deltalake refuses a table it cannot read
    exactly, e.g. one with deletion vectors). A file its log names but that is gone or damaged is refused in one
    line naming `field`."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    dataset = table.to_pyarrow_dataset()
    order = {f.path: i for i, f in enumerate(files)}
    fragments = sorted((f for f in dataset.get_fragments() if f.path in order), key=lambda f: order[f.path])
    if len(fragments) != len(order):
        raise UserError(f"{field} = {table.table_uri!r}: {len(order) - len(fragments)} data file(s) of its log are "
                        "not readable")
    try:
        return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem).to_table()
    except (OSError, pa.ArrowException) as exc:
        raise unreadable(field, table.table_uri, int(table.version()), exc) from None


def unreadable(field: str, uri: str, version: int, exc: BaseException) -> UserError:
    """The one line for a version whose log names a data file that is gone (a VACUUM, a retention rule) or
    damaged: nothing of the read is stored."""
    return UserError(f"{field} = {uri!r}: version {version} names a data file that cannot be read "
                     f"({type(exc).__name__}: {_short(exc)}) — removed by a VACUUM or retention rule, or damaged; "
                     "restore it or write its rows again (nothing was stored)")
