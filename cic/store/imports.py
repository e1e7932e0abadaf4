"""What `cic import` may bring into a store, checked before the store is opened (a refusal creates nothing).

A table of results (questions, runs, answers, scores, labels, calibrations, ...) is data: imported as it is,
with no time after now (a future `created_at` would sit in every later window). The store's own history of
decisions — gate states, monitor state, relabel events, the ingest journal — is never imported: a forged
`live` event or an unknown state would decide what serves. A gate imported with its calibration row serves
only once the store holds the pairs its certificate is recomputed from.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cic.errors import UserError

HISTORY = {"gate_events": "gate states (promote, retire and confirm gates in this store: `cic gate ...`)",
           "gate_monitor": "the anytime monitor's state (it restarts from this store's labels)",
           "label_events": "relabel history (ingest the labels with `cic ingest --relabel`)",
           "record_events": "replaced-record history (re-send the records with `cic ingest --replace`)",
           "ingests": "the ingest journal (ingest the files themselves)"}
CLOCK_SKEW = timedelta(minutes=5)


def checked_import(path: str | Path, table: str | None, known: dict[str, Any]) -> tuple[str, Any]:
    """(table name, Arrow table) of a Parquet file fit to import into one of the `known` tables, or a one-line
    refusal naming the file, the table, the column and the value."""
    import polars as pl
    import pyarrow.parquet as pq

    source = Path(path).expanduser()
    if not source.is_file():
        raise UserError(f"path = {str(source)!r}: no such file")
    try:
        arrow = pq.read_table(source)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise UserError(f"path = {str(source)!r} cannot be read as Parquet: {exc}") from None
    recorded = (arrow.schema.metadata or {}).get(b"cic.table", b"").decode() or None
    if table is None and recorded is None:
        raise UserError(f"path = {str(source)!r} does not say which table it holds; pass the table name")
    if table is not None and recorded is not None and table != recorded:
        raise UserError(f"path = {str(source)!r} holds table {recorded!r}, not {table!r}")
    name = table or recorded
    assert name is not None
    if name in HISTORY:
        raise UserError(f"table = {name!r}: {HISTORY[name]} is this store's own history and is never imported")
    if name not in known:
        raise UserError(f"table = {name!r}: no such table; one of {', '.join(sorted(set(known) - set(HISTORY)))}")
    frame = pl.from_arrow(arrow)
    latest = datetime.now(UTC) + CLOCK_SKEW
    for column, dtype in frame.schema.items():
        if isinstance(dtype, pl.Datetime) and frame.height:
            values = frame.get_column(column)
            if dtype.time_zone is None:
                values = values.dt.replace_time_zone("UTC")
            newest = values.max()
            if newest is not None and newest > latest:
                raise UserError(f"path = {str(source)!r}: {name}.{column} = {newest} is in the future (now "
                                f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC); nothing imported")
    return name, arrow


#: columns that say when and from where a row was written, not what it holds: an import may differ in them
BOOKKEEPING = ("created_at", "ingest", "source")


def changed_rows(store: Any, table: str, rows: str) -> Any:
    """Stored rows of `table` that the staged Parquet `rows` (the table's columns) would change: one row per changed
    column — run_key, question_id (null where the table has none), key (the row's natural key as JSON), field,
    old_value, new_value (as text) — ordered by key and field. Bookkeeping columns (`BOOKKEEPING`) do not count."""
    from cic import schema

    spec = schema.TABLES[table]
    on = " AND ".join(f"o.{k} = n.{k}" for k in spec.key)
    key = "json_object(" + ", ".join(f"'{k}', n.{k}" for k in spec.key) + ")"
    ids = ", ".join(f"n.{c}" if c in spec.columns else f"NULL::VARCHAR AS {c}" for c in ("run_key", "question_id"))
    parts = [f"SELECT {ids}, {key} AS key, '{c}' AS field, CAST(o.{c} AS VARCHAR) AS old_value, "
             f"CAST(n.{c} AS VARCHAR) AS new_value FROM read_parquet(?) n JOIN {table} o ON {on} "
             f"WHERE o.{c} IS DISTINCT FROM n.{c}"
             for c in spec.columns if c not in spec.key and c not in BOOKKEEPING]
    if not parts:
        select = f"{ids}, {key} AS key, '' AS field, '' AS old_value, '' AS new_value"
        return store.sql_frame(f"SELECT {select} FROM read_parquet(?) n WHERE false", [rows])
    return store.sql_frame(" UNION ALL ".join(parts) + " ORDER BY key, field", [rows] * len(parts))
