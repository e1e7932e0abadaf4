"""Schema version and migrations: a store file is brought to `SCHEMA_VERSION` in one transaction when it is opened
for writing (additive changes — a new nullable column or table in `cic.schema` — need no entry: `_add_missing`),
and a read-only open refuses an older or newer layout in one line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic import schema

if TYPE_CHECKING:
    import duckdb

from cic.store.layout import _SQL_TYPE_NAMES, SCHEMA_VERSION, StoreError, create_table_sql, duckdb_type


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
                                 "(cic.store.migrations.MIGRATIONS)")


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
