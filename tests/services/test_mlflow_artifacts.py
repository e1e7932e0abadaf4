"""Artifact locations that survive a move: a tracking server's served artifacts (`mlflow-artifacts:`) need no
rewrite; a local SQLite store's relocation is all or nothing. Real MLflow stores and a real `mlflow server`."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from cic.errors import UserError
from cic.services import mlflow_artifacts as artifact_locations
from cic.services.mlflow_artifacts import check_not_moved, moved_experiments, relocate
from cic.services.registry_sync import registry_sync
from tests.services.test_mlflow_registry import live_store
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # starts mlflow servers


def test_a_served_artifact_store_moves_with_its_folder_and_needs_no_relocation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = tmp_path / "a", tmp_path / "b"
    old.mkdir()
    [row] = live_store(old / "g.duckdb", ("m",))
    server = MlflowServer(old, artifacts=old / "mlartifacts").start()
    try:
        [registered] = registry_sync(str(old / "g.duckdb"), server.url, None)
        name, alias = registered.rsplit("@", 1)
    finally:
        server.kill()
    shutil.move(old, new)
    server = MlflowServer(new, artifacts=new / "mlartifacts").start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        client = MlflowClient()
        version = client.get_model_version_by_alias(name, alias)
        assert client.get_run(version.run_id).info.artifact_uri.startswith("mlflow-artifacts:/")
        check_not_moved(server.url)  # nothing recorded is absolute
        fetched = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@{alias}", dst_path=str(tmp_path / "dl")))
        assert '"threshold"' in (fetched / "gate.json").read_text() and row["state"] == "live"
        with pytest.raises(UserError, match="only a local SQLite store"):
            relocate(server.url)
    finally:
        server.kill()


def _moved_sqlite_store(tmp_path: Path) -> str:
    """A local store with a registered live gate, created in tmp/a and moved to tmp/b: its tracking URI."""
    old, new = tmp_path / "a", tmp_path / "b"
    old.mkdir()
    live_store(old / "g.duckdb", ("m",))
    registry_sync(str(old / "g.duckdb"), f"sqlite:///{old}/mlflow.db", None)
    shutil.move(old, new)
    return f"sqlite:///{new}/mlflow.db"


def test_a_relocation_stopped_midway_leaves_every_location_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _moved_sqlite_store(tmp_path)
    [before] = moved_experiments(uri)
    calls = []
    real_columns = artifact_locations._columns

    def dies_on_the_third_table(conn: object, table: str) -> set[str]:
        calls.append(table)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill between two UPDATEs
        return real_columns(conn, table)  # type: ignore[arg-type]

    monkeypatch.setattr(artifact_locations, "_columns", dies_on_the_third_table)
    with pytest.raises(KeyboardInterrupt):
        relocate(uri)
    assert moved_experiments(uri) == [before]
    run = MlflowClient(tracking_uri=uri).search_runs([before.experiment_id])[0]
    assert run.info.artifact_uri.startswith(before.recorded)  # the runs' UPDATE was rolled back too
    monkeypatch.undo()
    assert relocate(uri) == [before] and moved_experiments(uri) == []


def test_a_store_that_does_not_exist_is_not_created_by_the_check_and_an_empty_one_passes(tmp_path: Path) -> None:
    check_not_moved(f"sqlite:///{tmp_path}/absent.db")
    assert moved_experiments(f"sqlite:///{tmp_path}/absent.db") == [] and not (tmp_path / "absent.db").exists()
    (tmp_path / "empty.db").touch()  # MLflow initialises an empty file on first use: nothing to refuse
    check_not_moved(f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(UserError, match="is an empty file: no experiment to relocate"):
        relocate(f"sqlite:///{tmp_path}/empty.db")
    assert (tmp_path / "empty.db").stat().st_size == 0  # refused, and not rewritten into a SQLite header


def test_a_store_another_writer_holds_is_refused_after_the_wait_and_left_as_it_was(tmp_path: Path) -> None:
    import sqlite3

    uri = _moved_sqlite_store(tmp_path)
    before = moved_experiments(uri)
    writer = sqlite3.connect(tmp_path / "b" / "mlflow.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # an MLflow server mid-write, say
    try:
        with pytest.raises(UserError, match="stayed locked by another writer for 0.2 s; nothing changed"):
            relocate(uri, wait_s=0.2)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert moved_experiments(uri) == before


KILLED_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE experiments SET artifact_location = '/half-written'")  # spills to the file: the journal is hot
conn.execute("CREATE TABLE filler AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000)"
             " SELECT i, printf('%0200d', i) AS pad FROM n")
print("inside", flush=True)
time.sleep(120)
"""


def test_a_store_whose_writer_was_killed_mid_transaction_is_rolled_back_and_read(tmp_path: Path) -> None:
    """A `cic run` killed while it logged leaves a hot journal; the next run's checks read the store (rolling the
    half-written transaction back, as SQLite recovers) instead of failing on a read-only connection."""
    import signal
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("kept", artifact_location=str(tmp_path / "mlartifacts" / "kept"))
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "mlflow.db")],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "inside"
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0  # the killed writer's transaction, not rolled back

    assert moved_experiments(uri) == []
    check_not_moved(uri)
    assert not (tmp_path / "mlflow.db-journal").exists()  # rolled back: the store is as the last commit left it
    kept = MlflowClient(tracking_uri=uri).get_experiment_by_name("kept")
    assert kept is not None and kept.artifact_location == str(tmp_path / "mlartifacts" / "kept")
