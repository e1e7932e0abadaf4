"""A local MLflow store whose first migration was stopped (SIGTERM) is refused in one line naming the fix, before
any logging; moved aside as the line says, the next command sets up a new store and works."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cic.errors import UserError
from cic.services.mlflow_setup import check_set_up, head_revision
from cic.store import Store
from tests.pipeline.test_recalibration import make_live, only_group
from tests.support.pipeline_data import store_run

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # runs cic against new stores
CIC = str(Path(sys.executable).with_name("cic"))
# MLflow's first use of a new SQLite file, SIGTERMed by itself right after its N-th CREATE TABLE: the same signal
# an operator's stop sends, at a point that does not depend on how busy the machine is
FIRST_USE = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine
created = [0]
@event.listens_for(Engine, "after_cursor_execute")
def count(conn, cursor, statement, *args):
    if statement.lstrip().upper().startswith("CREATE TABLE"):
        created[0] += 1
        if created[0] >= int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGTERM)
from mlflow import MlflowClient
MlflowClient(tracking_uri=sys.argv[1]).search_experiments()
"""


def _tables(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    except sqlite3.DatabaseError:
        return 0


def _revision(db: Path) -> str | None:
    with sqlite3.connect(db) as conn:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.OperationalError:
            return None
    return row[0] if row else None


def half_set_up(db: Path) -> None:
    """SIGTERM MLflow's first use of a new SQLite file after it has created some tables, until the file is left in
    a state MLflow's next use cannot finish; a few tries at most."""
    uri = f"sqlite:///{db}"
    for enough in (38, 52, 7, 20, 45, 30):  # tables created before the SIGTERM
        db.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-c", FIRST_USE, uri, str(enough)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=120)
        assert proc.returncode in (-signal.SIGTERM, 0), proc.returncode
        if not (db.exists() and _tables(db) and _revision(db) != head_revision(uri)):
            continue
        try:
            check_set_up(uri)  # MLflow's next use, in this process: it finishes the setup, or cannot
        except UserError:
            return  # it cannot ("table … already exists"): every later command met a traceback
    pytest.fail("no SIGTERM left MLflow's first migration in a state it cannot finish")
    pytest.fail("MLflow's first migration finished before every SIGTERM")


def test_a_store_stopped_during_mlflows_first_migration_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    with Store.open(tmp_path / "cic.duckdb") as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC), estimators=("semantic_entropy",))
        make_live(store, only_group(store))
    broken = tmp_path / "mlflow.db"
    half_set_up(broken)
    sync = [CIC, "gate", "sync", "--db", "cic.duckdb", "--tracking-uri", f"sqlite:///{broken}"]
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    refused = subprocess.run(sync, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"MLflow store {broken} was left half set up" in refused.stderr and "it holds no runs" in refused.stderr
    assert f"`mv {broken} {broken}.broken`" in refused.stderr
    broken.rename(tmp_path / "mlflow.db.broken")  # as the line says
    fixed = subprocess.run(sync, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert _revision(broken) == head_revision(f"sqlite:///{broken}")


CONCURRENT_USE = """
import sys
from cic.services.mlflow_setup import check_before_logging
from mlflow import MlflowClient
check_before_logging(sys.argv[1])
MlflowClient(tracking_uri=sys.argv[1]).create_experiment(sys.argv[2])
"""


def test_commands_meeting_a_new_store_at_once_wait_for_one_set_up_and_all_succeed(tmp_path: Path) -> None:
    """Three processes that first meet the same new SQLite store together (two `cic run`s started by one cron
    line): one sets it up under the lock, the others wait instead of calling its migration half set up."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_USE, uri, f"e{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    outcomes = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    assert [rc for rc, _ in outcomes] == [0, 0, 0], [err[-600:] for _, err in outcomes]
    assert _revision(db) == head_revision(uri)
    with sqlite3.connect(db) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM experiments")}
    assert {"e0", "e1", "e2"} <= names


def test_the_upgrade_advice_is_given_only_where_it_works_on_a_copy(tmp_path: Path) -> None:
    """A store MLflow left at an older schema revision (complete up to it) upgrades on a copy; a store stopped
    during its first migration does not — it gets the move-aside advice, which the test above runs."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config, create_sqlalchemy_engine_with_retry
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    from cic.services.mlflow_setup import upgrades_cleanly

    old = tmp_path / "old" / "mlflow.db"
    old.parent.mkdir()
    uri = f"sqlite:///{old}"
    engine = create_sqlalchemy_engine_with_retry(uri)
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(uri)
    revisions = list(ScriptDirectory.from_config(config).walk_revisions())
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revisions[len(revisions) // 2].revision)
    engine.dispose()
    before = old.read_bytes()
    assert upgrades_cleanly(old) and old.read_bytes() == before  # tried on a copy: the store is untouched
    broken = tmp_path / "broken" / "mlflow.db"
    broken.parent.mkdir()
    half_set_up(broken)
    assert not upgrades_cleanly(broken)
