"""A local MLflow store left half set up: a process stopped during MLflow's first migration of a new SQLite file
leaves tables behind without the revision that says so, and every later client fails with "table … already
exists". Found before any logging, with the fix named, instead of a traceback on every command."""

from __future__ import annotations

import sqlite3

from cic.errors import UserError
from cic.services.mlflow_artifacts import check_not_moved, sqlite_file, store_state


def head_revision(tracking_uri: str) -> str:
    """The schema revision this MLflow sets a new store up to."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return str(ScriptDirectory.from_config(_get_alembic_config(tracking_uri)).get_current_head())


def check_set_up(tracking_uri: str) -> None:
    """Refuse a local store whose schema MLflow cannot finish (a half-created file, or one from an older MLflow),
    naming the fix; a store MLflow completes by itself, a new or empty file, and a server pass."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None or not db_file.is_file():
        return
    try:
        tables, revision, runs = store_state(db_file)
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


def check_before_logging(tracking_uri: str) -> None:
    """What every command checks before it logs to a local store: set up, and not moved."""
    check_set_up(tracking_uri)
    check_not_moved(tracking_uri)
