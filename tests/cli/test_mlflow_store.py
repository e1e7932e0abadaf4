"""`cic mlflow relocate`: a local SQLite store moved with its mlartifacts folder is refused for logging until it
is relocated, and then serves its artifacts again — to MLflow's client, its registry (`models:/…@live`) and a
real `mlflow server`'s UI routes. Bad input exits 2 and changes nothing."""

from __future__ import annotations

import json
import shutil
import sqlite3
import urllib.parse
import urllib.request
from contextlib import closing
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from cic.cli import app
from tests.services.test_mlflow_registry import live_store
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # starts mlflow servers
runner = CliRunner()


def _locations(db_file: Path) -> list[tuple]:
    with closing(sqlite3.connect(db_file)) as conn:
        return (conn.execute("SELECT name, artifact_location FROM experiments ORDER BY name").fetchall()
                + conn.execute("SELECT run_uuid, artifact_uri FROM runs ORDER BY run_uuid").fetchall()
                + conn.execute("SELECT name, version, source FROM model_versions ORDER BY name").fetchall())


def _registered_store(root: Path) -> tuple[str, str, float]:
    """A store with a live gate registered in MLflow beside it: (tracking URI, registered model, threshold)."""
    root.mkdir(parents=True)
    uri = f"sqlite:///{root}/mlflow.db"
    [row] = live_store(root / "g.duckdb", ("m",))
    synced = runner.invoke(app, ["gate", "sync", "--db", str(root / "g.duckdb"), "--tracking-uri", uri])
    assert synced.exit_code == 0, synced.output
    [model] = MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()
    [alias] = model.aliases
    return uri, f"{model.name}@{alias}", row["threshold"]


def test_a_moved_store_is_refused_then_relocated_and_serves_its_gate_to_client_registry_and_ui(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_root, new_root = tmp_path / "run dir é" / "a", tmp_path / "moved dir #1" / "b"
    old_uri, name, threshold = _registered_store(old_root)
    own = MlflowClient(tracking_uri=old_uri)  # a user's own experiment, artifacts wherever they chose
    own_location = (tmp_path / "elsewhere").as_uri()
    own_run = own.create_run(own.create_experiment("mine", artifact_location=own_location))
    own.log_text(own_run.info.run_id, "kept", "note.txt")

    new_root.parent.mkdir()
    shutil.move(old_root, new_root)
    uri = f"sqlite:///{new_root}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # how a serving system names the store (registry too)
    before = _locations(new_root / "mlflow.db")
    stale = mlflow.artifacts.download_artifacts(f"models:/{name}", dst_path=str(tmp_path / "dl0"))
    assert not (Path(stale) / "gate.json").exists()  # MLflow finds nothing at the recorded folder, silently
    refused = runner.invoke(app, ["gate", "sync", "--db", str(new_root / "g.duckdb"), "--tracking-uri", uri])
    assert refused.exit_code == 2
    assert "was moved" in refused.output and "cic mlflow relocate" in " ".join(refused.output.split())
    assert not old_root.exists()  # nothing was written into the old folder
    assert _locations(new_root / "mlflow.db") == before

    relocated = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", uri])
    assert relocated.exit_code == 0, relocated.output
    assert "cic-gates:" in relocated.output and "mine" not in relocated.output
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = client.get_model_version_by_alias(*name.split("@"))
    gate_file = Path(mlflow.artifacts.download_artifacts(f"models:/{name}", dst_path=str(tmp_path / "dl")))
    gate_file = gate_file / "gate.json"
    assert json.loads(gate_file.read_text())["threshold"] == threshold
    here = (new_root / "mlartifacts").as_uri()
    assert client.get_run(version.run_id).info.artifact_uri.startswith(here) and version.source.startswith(here)
    assert client.get_experiment_by_name("mine").artifact_location == own_location  # not CIC's: untouched

    again = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", uri])
    assert again.exit_code == 0 and "nothing to relocate" in again.output
    assert runner.invoke(app, ["gate", "sync", "--db", str(new_root / "g.duckdb"),
                               "--tracking-uri", uri]).exit_code == 0

    server = MlflowServer(tmp_path, backend=uri, artifacts=tmp_path / "unused").start()
    try:  # the routes MLflow's UI fetches a run's and a registered version's artifact from
        query = urllib.parse.urlencode({"path": "gate/gate.json", "run_uuid": version.run_id})
        with urllib.request.urlopen(f"{server.url}/get-artifact?{query}", timeout=30) as response:
            assert json.loads(response.read())["threshold"] == threshold
        query = urllib.parse.urlencode({"path": "gate.json", "name": name.split("@")[0], "version": version.version})
        with urllib.request.urlopen(f"{server.url}/model-versions/get-artifact?{query}", timeout=30) as response:
            assert json.loads(response.read())["threshold"] == threshold
    finally:
        server.kill()


def test_relocating_a_store_whose_artifacts_were_left_behind_changes_nothing(tmp_path: Path) -> None:
    uri, _, _ = _registered_store(tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.move(tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db")  # without mlartifacts/
    before = _locations(tmp_path / "b" / "mlflow.db")
    result = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", f"sqlite:///{tmp_path}/b/mlflow.db"])
    assert result.exit_code == 2
    assert "its artifacts are not at" in result.output and "nothing changed" in " ".join(result.output.split())
    assert _locations(tmp_path / "b" / "mlflow.db") == before


@pytest.mark.parametrize(("uri", "message"), [
    ("http://127.0.0.1:9", "only a local SQLite store"),
    ("sqlite:///{tmp}/absent.db", "does not exist"),
    ("sqlite:///{tmp}/not-mlflow.db", "is not an MLflow SQLite store"),
])
def test_relocate_refuses_what_it_cannot_relocate(tmp_path: Path, uri: str, message: str) -> None:
    (tmp_path / "not-mlflow.db").write_bytes(b"plain text, not SQLite")
    result = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", uri.format(tmp=tmp_path)])
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert not (tmp_path / "absent.db").exists()
    assert (tmp_path / "not-mlflow.db").read_bytes() == b"plain text, not SQLite"


def test_run_and_log_refuse_a_moved_store_before_any_work(tmp_path: Path) -> None:
    from cic.services.mlflow_tracking import experiment_id

    (tmp_path / "a").mkdir()
    experiment_id(MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/a/mlflow.db"), "cic-trivia_qa")
    shutil.move(tmp_path / "a", tmp_path / "b")
    uri = f"sqlite:///{tmp_path}/b/mlflow.db"
    table = tmp_path / "t.csv"
    table.write_text("model,dataset,estimator,criterion,question_id,score,error\nm,d,e,c,q1,0.1,0\n")
    for args in (["run", "--db", str(tmp_path / "c.duckdb"), "--report-dir", str(tmp_path / "r")],
                 ["log", str(table), "--report-dir", str(tmp_path / "r")]):
        result = runner.invoke(app, [*args, "--tracking-uri", uri])
        assert result.exit_code == 2 and "was moved" in result.output, result.output
        assert not (tmp_path / "c.duckdb").exists() and not (tmp_path / "a").exists()


def test_relocate_refuses_a_sqlite_file_that_is_not_an_mlflow_store_and_leaves_it_alone(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
        conn.commit()
    before = other.read_bytes()
    result = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", f"sqlite:///{other}"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "nothing to relocate" not in text, result.output
    assert "is not an MLflow SQLite store: it holds table(s) users but no experiments table" in text, text
    assert other.read_bytes() == before
    empty = tmp_path / "empty.db"
    empty.touch()  # a file MLflow has not initialised yet: nothing to relocate, and not rewritten
    refused = runner.invoke(app, ["mlflow", "relocate", "--tracking-uri", f"sqlite:///{empty}"])
    assert refused.exit_code == 2 and "is an empty file: no experiment to relocate" in refused.output, refused.output
    assert empty.stat().st_size == 0
