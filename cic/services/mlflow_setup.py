"""A local MLflow store left half set up: a process stopped during MLflow's first migration of a new SQLite file
leaves tables behind without the revision that says so, and every later client fails with "table … already
exists". Found before any logging, with the fix named, instead of a traceback on every command."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from cic.errors import UserError
from cic.services.mlflow_artifacts import sqlite_file


def head_revision(tracking_uri: str) -> str:
    """The schema revision this MLflow sets a new store up to."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return str(ScriptDirectory.from_config(_get_alembic_config(tracking_uri)).get_current_head())


def _state(db_file: object) -> tuple[int, str | None, int | None]:
    """(tables, stored revision or None, runs or None) of a SQLite file."""
    with closing(sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        revision = (conn.execute("SELECT version_num FROM alembic_version").fetchone() or [None])[0] \
            if "alembic_version" in tables else None
        runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else None
    return len(tables), revision, runs


def check_set_up(tracking_uri: str) -> None:
    """Refuse a local store whose schema MLflow cannot finish (a half-created file, or one from an older MLflow),
    naming the fix; a store MLflow completes by itself, a new or empty file, and a server pass."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None or not db_file.is_file():
        return
    try:
        tables, revision, runs = _state(db_file)
    except sqlite3.DatabaseError:
        return  # not SQLite at all: the moved-store check names that
    if tables == 0 or revision == head_revision(tracking_uri):
        return
    from mlflow import MlflowClient

    try:  # MLflow finishes a setup that stopped between its steps by itself; see whether it can
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
        return
    except Exception as exc:  # noqa: BLE001 - any failure here means the store cannot be used as it is
        why = " ".join(str(exc).split("[SQL")[0].split())[:160]
    if "out-of-date database schema" in why:
        raise UserError(f"MLflow store {db_file} was made by an older MLflow (schema {revision}): back it up, then "
                        f"run `mlflow db upgrade {tracking_uri}`") from None
    holds = "it holds no runs" if not runs else f"it holds {runs} run(s) — keep the copy"
    raise UserError(f"MLflow store {db_file} was left half set up (a process stopped during MLflow's first "
                    f"migration: {tables} tables, schema {revision or 'none'}; {why}); {holds}: move it aside "
                    f"(`mv {db_file} {db_file}.broken`) and rerun, MLflow sets up a new one") from None
