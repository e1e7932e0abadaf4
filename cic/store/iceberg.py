"""Iceberg tables as a lake source (`pyiceberg`, the optional extra `cic[iceberg]`): `iceberg://CATALOG/NS.TABLE`
names a table of a catalog pyiceberg is configured with (`~/.pyiceberg.yaml`, or `PYICEBERG_CATALOG__<NAME>__URI`
and friends), read data file by data file like a Delta table.

The store knows the table by its name and its uuid: a table dropped and created again under the same name is
another table, refused rather than read as if it had grown. The version is the current snapshot's sequence
number (monotonic in the table's history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cic.errors import UserError
from cic.store.lake import DataFile, LakeSource, unreadable

PREFIX = "iceberg://"


def parse_name(uri: str, field: str) -> tuple[str, str]:
    """(catalog, namespace.table) of `iceberg://CATALOG/NAMESPACE.TABLE`, or one line naming what is wrong."""
    catalog, _, name = uri.removeprefix(PREFIX).partition("/")
    if not catalog or "." not in name.strip(".") or "/" in name:
        raise UserError(f"{field} = {uri!r}: give iceberg://CATALOG/NAMESPACE.TABLE (a catalog pyiceberg is "
                        "configured with, e.g. in ~/.pyiceberg.yaml)")
    return catalog, name


def iceberg_source(uri: str, field: str) -> LakeSource:
    """The Iceberg table `uri` names, as a source; one line when pyiceberg is absent, the catalog unknown or
    unreachable, or the table missing."""
    catalog_name, name = parse_name(uri, field)
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError:
        raise UserError(f"{field} = {uri!r}: reading Iceberg tables needs pyiceberg: pip install 'cic[iceberg]'") \
            from None
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from pyiceberg.utils.config import Config

    try:  # the configuration read now, not when pyiceberg was first imported: a long-lived worker sees changes
        table = load_catalog(catalog_name, **(Config().get_catalog_config(catalog_name) or {})).load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise UserError(f"{field} = {uri!r}: catalog {catalog_name!r} has no table {name!r}") from None
    except Exception as exc:  # no such catalog configured, a catalog that does not answer
        text = " ".join(str(exc).split())[:200]
        raise UserError(f"{field} = {uri!r}: catalog {catalog_name!r} cannot be reached ({type(exc).__name__}: "
                        f"{text})") from None
    snapshot = table.current_snapshot()
    version = int(snapshot.sequence_number or 0) if snapshot is not None else -1
    return LakeSource(f"{PREFIX}{catalog_name}/{name}#{table.metadata.table_uuid}", version,
                      [f.name for f in table.schema().fields], lambda: _data_files(table),
                      lambda files: _read(table, files, field, uri, version), family=f"{PREFIX}{catalog_name}/{name}")


def _tasks(table: Any) -> list[Any]:
    return list(table.scan().plan_files()) if table.current_snapshot() is not None else []


def _data_files(table: Any) -> list[DataFile]:
    """The data files of the current snapshot, oldest first (by the sequence number that added them, then path)."""
    tasks = _tasks(table)
    if not tasks:
        return []
    added = {row["data_file"]["file_path"]: int(row["sequence_number"] or 0)
             for row in table.inspect.entries().select(["sequence_number", "data_file"]).to_pylist()}
    files = [DataFile(t.file.file_path, added.get(t.file.file_path, 0), int(t.file.record_count)) for t in tasks]
    return sorted(files, key=lambda f: (f.order, f.path))


def _read(table: Any, files: Sequence[DataFile], field: str, uri: str, version: int) -> Any:
    """These data files' rows (deletes that apply to them applied), in the given order; a file that is gone or
    damaged refused in one line."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import ArrowScan

    scan = table.scan()
    by_path = {t.file.file_path: t for t in _tasks(table)}
    reader = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    try:
        parts = [reader.to_table([by_path[f.path]]) for f in files]
    except (OSError, pa.ArrowException) as exc:
        raise unreadable(field, uri, version, exc) from None
    return pa.concat_tables(parts) if parts else table.schema().as_arrow().empty_table()
