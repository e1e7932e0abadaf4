"""MLflow's registry serves the right gate: names are injective, a quote in a model name is harmless, the alias
moves only onto a version whose tags name the gate and key, and `cic gate sync` reconciles both ways after an
outage (and exits 1 while MLflow is down). Real MLflow on a SQLite store in a temp dir."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from cic.cli import app
from cic.pipeline.gates import gates, retire
from cic.store import Store
from tasks.registry import RegistryMismatch, legacy_name, registered_name, registry_sync
from tests.pipeline.test_recalibration import make_live
from tests.support.pipeline_data import store_run

pytestmark = pytest.mark.faults
runner = CliRunner()
DOWN = "http://127.0.0.1:9"  # discard port: nothing answers


def live_store(db: Path, models: tuple[str, ...]) -> list[dict]:
    with Store.open(db) as store:
        for k, model in enumerate(models):
            store_run(store, model=model, n=400, seed=k, labelled_at=datetime(2026, 1, 1, tzinfo=UTC),
                      estimators=("semantic_entropy",))
        for group in [g for g in _groups(store)]:
            make_live(store, group)
        return gates(store).filter(state="live").sort("model").to_dicts()


def _groups(store: Store) -> list:
    from cic.pipeline.stored_calibration import groups_of_run

    return [g for run in store.read("runs").iter_rows(named=True) for g in groups_of_run(store, run)]


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_models_whose_old_names_collided_get_their_own_registered_model(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    a, b = live_store(db, ("org/m", "org:m"))
    assert legacy_name(a) == legacy_name(b)  # what used to serve one model's gate for the other
    assert registered_name(a) != registered_name(b)
    registry_sync(str(db), uri, None)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for row in (a, b):
        version = client.get_model_version_by_alias(registered_name(row), "live")
        assert version.tags["cic.gate_id"] == row["calibration_id"]


def test_a_quote_in_a_model_name_registers_and_serves(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("o'brien's \"model\"",))
    result = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert client.get_model_version_by_alias(registered_name(row), "live").tags["cic.gate_id"] == \
        row["calibration_id"]


def test_the_alias_never_moves_onto_a_registered_model_of_another_key(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(registered_name(row), tags={"cic.serving_key": '{"model": "other"}'})
    with pytest.raises(RegistryMismatch, match="belongs to serving key"):
        registry_sync(str(db), uri, None)
    assert client.get_registered_model(registered_name(row)).aliases == {}


def test_retire_during_an_outage_then_sync_clears_live_and_sync_fails_while_down(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri]).exit_code == 0
    name = registered_name(row)
    assert client.get_registered_model(name).aliases == {"live": 1}

    retired = runner.invoke(app, ["gate", "retire", row["calibration_id"][:12], "--db", str(db),
                                  "--tracking-uri", DOWN])
    assert retired.exit_code == 0, retired.output  # the store holds the new state
    assert "cic gate sync" in " ".join(retired.output.split())
    assert client.get_registered_model(name).aliases == {"live": 1}  # the outage left it behind

    down = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", DOWN])
    assert down.exit_code == 1 and "not synced" in down.output and "does not answer" in down.output

    back = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert back.exit_code == 0, back.output
    assert client.get_registered_model(name).aliases == {}  # nothing is served for a retired key
    assert client.get_model_version(name, "1").tags["cic.state"] == "retired"


def test_sync_clears_the_alias_left_on_a_legacy_name(tmp_path: Path, uri: str) -> None:
    import json

    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    old = legacy_name(row)
    key = {k: row[k] for k in ("model", "dataset", "estimator", "criterion", "alpha", "delta", "bound", "search")}
    client.create_registered_model(old, tags={"cic.serving_key": json.dumps(key)})
    run = client.create_run(client.create_experiment("legacy"))
    version = client.create_model_version(old, f"{run.info.artifact_uri}/gate", run_id=run.info.run_id)
    client.set_registered_model_alias(old, "live", version.version)
    with Store.open(db) as store:
        retire(store, row["calibration_id"], reason="test")
    registry_sync(str(db), uri, None)
    assert client.get_registered_model(old).aliases == {}
