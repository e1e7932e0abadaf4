"""A local MLflow store set up once, safely: a new SQLite file is set up by one cic process at a time (a lock file
beside it; the others wait, then find it done), and a store left half set up — a process stopped during MLflow's
first migration leaves tables behind without the revision that says so — or made by an older MLflow is found
before any logging, with a fix that was first tried on a copy of the file, instead of a traceback on every
command."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from cic.errors import UserError
from cic.services.mlflow_artifacts import check_not_moved, sqlite_file, store_state

SETUP_WAIT_S = 300.0  # how long a command waits for another one setting the same new store up


def head_revision(tracking_uri: str) -> str:
    """The schema revision this MLflow sets a new store up to."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return str(ScriptDirectory.from_config(_get_alembic_config(tracking_uri)).get_current_head())


@contextlib.contextmanager
def setup_lock(db_file: Path, wait_s: float = SETUP_WAIT_S) -> Iterator[None]:
    """Hold the store's set-up lock (filelock on `.<name>.cic-setup-lock` beside it), waiting up to `wait_s` for a
    cic process that holds it; released when the process ends, however it ends."""
    from filelock import FileLock, Timeout

    path = db_file.parent / f".{db_file.name}.cic-setup-lock"
    try:
        lock = FileLock(path, timeout=wait_s, poll_interval=0.2).acquire()
    except Timeout:
        raise UserError(f"MLflow store {db_file}: another cic process has been setting it up for {wait_s:.0f} s "
                        f"(lock {path}); wait for it, or stop it and rerun") from None
    with lock:
        yield


def check_set_up(tracking_uri: str, *, create: bool = True) -> None:
    """Refuse a local store whose schema MLflow cannot finish, naming a fix tried on a copy first, and with
    `create` set a new one up — one process at a time: a second command waits for the first's migration rather
    than reading it half done. Without `create` (a command's check before any work) a store that does not exist
    yet is left to the first logging. A store MLflow completes by itself passes, and so does a server."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None or not db_file.parent.is_dir() or (not create and not db_file.exists()):
        return
    with setup_lock(db_file):
        _checked(tracking_uri, db_file, create)


def _checked(tracking_uri: str, db_file: Path, create: bool) -> None:
    try:
        tables, revision, runs = store_state(db_file) if db_file.is_file() else (0, None, None)
    except sqlite3.DatabaseError:
        return  # not SQLite at all: the moved-store check names that
    if (tables and revision == head_revision(tracking_uri)) or (not tables and not create):
        return
    from mlflow import MlflowClient

    try:  # a new file is set up here, under the lock; MLflow finishes a setup stopped between its steps by itself
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
        return
    except Exception as exc:  # noqa: BLE001 - any failure here means the store cannot be used as it is
        why = " ".join(str(exc).split("[SQL")[0].split())[:160]
    if not tables:
        raise UserError(f"MLflow store {db_file} cannot be set up: {why}") from None
    keep = "it holds no runs" if not runs else f"it holds {runs} run(s) — keep the copy"
    if upgrades_cleanly(db_file):
        raise UserError(f"MLflow store {db_file} has schema {revision or 'none'}, older than this MLflow's "
                        f"({why}); {keep}: back it up (`cp {db_file} {db_file}.bak`), then run `mlflow db upgrade "
                        f"{tracking_uri}` (tried on a copy: it completes)") from None
    raise UserError(f"MLflow store {db_file} was left half set up (a process stopped during MLflow's first "
                    f"migration: {tables} tables, schema {revision or 'none'}; {why}); {keep}: move it aside "
                    f"(`mv {db_file} {db_file}.broken`) and rerun, MLflow sets up a new one") from None


def upgrades_cleanly(db_file: Path) -> bool:
    """Whether MLflow's own upgrade (`mlflow db upgrade`) brings a copy of the store to this MLflow's schema."""
    import shutil
    import tempfile

    from mlflow.store.db.utils import _upgrade_db, create_sqlalchemy_engine_with_retry

    with tempfile.TemporaryDirectory(prefix="cic-mlflow-upgrade-") as tmp:
        copy = Path(tmp) / db_file.name
        shutil.copy2(db_file, copy)
        uri = f"sqlite:///{copy}"
        try:
            engine = create_sqlalchemy_engine_with_retry(uri)
            try:
                _upgrade_db(engine)
            finally:
                engine.dispose()
            return store_state(copy)[1] == head_revision(uri)
        except Exception:  # noqa: BLE001 - whatever stops the upgrade, it does not work on this file
            return False


def check_before_logging(tracking_uri: str, *, create: bool = True) -> None:
    """What every command checks before it logs to a local store: set up (`create`: a new one set up now), and not
    moved."""
    check_set_up(tracking_uri, create=create)
    check_not_moved(tracking_uri)
