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
from cic.pipeline.gates.lifecycle import gates
from cic.services.mlflow_registry import (
    RegistryMismatch,
    legacy_name,
    live_alias,
    per_key_name,
    registered_name,
)
from cic.services.registry_sync import registry_sync
from cic.store import Store
from tests.pipeline.test_recalibration import make_live
from tests.support.pipeline_data import store_run

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # multi-step scenarios: the slow tier
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
    from cic.pipeline.run.stored_calibration import groups_of_run

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
        version = client.get_model_version_by_alias(registered_name(row), live_alias(row))
        assert version.tags["cic.gate_id"] == row["calibration_id"]


def test_a_quote_in_a_model_name_registers_and_serves(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("o'brien's \"model\"",))
    result = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert client.get_model_version_by_alias(registered_name(row), live_alias(row)).tags["cic.gate_id"] == \
        row["calibration_id"]


def test_the_alias_never_moves_onto_a_registered_model_of_another_key(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(registered_name(row), tags={"cic.group_key": '{"model": "other"}'})
    with pytest.raises(RegistryMismatch, match="belongs to"):
        registry_sync(str(db), uri, None)
    assert client.get_registered_model(registered_name(row)).aliases == {}


def test_retire_during_an_outage_then_sync_clears_live_and_sync_fails_while_down(tmp_path: Path, uri: str) -> None:
    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri]).exit_code == 0
    name = registered_name(row)
    alias = live_alias(row)
    assert alias == "live-cp-fixed_sequence-a0p3-d0p05", alias  # readable: bound, search, α, δ
    assert client.get_registered_model(name).aliases == {alias: 1}

    retired = runner.invoke(app, ["gate", "retire", row["calibration_id"][:12], "--db", str(db),
                                  "--tracking-uri", DOWN])
    assert retired.exit_code == 0, retired.output  # the store holds the new state
    assert "cic gate sync" in " ".join(retired.output.split())
    assert client.get_registered_model(name).aliases == {alias: 1}  # the outage left it behind

    down = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", DOWN])
    assert down.exit_code == 2 and "does not answer" in down.output  # a service down: one line, exit 2
    assert len(down.output.strip().splitlines()) == 1, down.output

    back = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert back.exit_code == 0, back.output
    assert client.get_registered_model(name).aliases == {}  # nothing is served for a retired key
    assert client.get_model_version(name, "1").tags["cic.state"] == "retired"


def test_sync_clears_the_alias_left_on_a_legacy_name(tmp_path: Path, uri: str) -> None:
    import json

    db = tmp_path / "g.duckdb"
    [row] = live_store(db, ("m",))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    key = {k: row[k] for k in ("model", "dataset", "estimator", "criterion", "alpha", "delta", "bound", "search")}
    run = client.create_run(client.create_experiment("legacy"))
    for old in (legacy_name(row), per_key_name(row)):  # the first versions' names, then one model per key
        client.create_registered_model(old, tags={"cic.serving_key": json.dumps(key)})
        version = client.create_model_version(old, f"{run.info.artifact_uri}/gate", run_id=run.info.run_id)
        client.set_registered_model_alias(old, "live", version.version)
    registry_sync(str(db), uri, None)
    for old in (legacy_name(row), per_key_name(row)):
        assert client.get_registered_model(old).aliases == {}  # served from the group's model and its alias now
    assert client.get_model_version_by_alias(registered_name(row), live_alias(row)).tags["cic.gate_id"] == \
        row["calibration_id"]


def test_gates_that_serve_nothing_are_never_registered_and_one_model_holds_a_group(tmp_path: Path,
                                                                                  uri: str) -> None:
    """380 registered models with `@live` on `"threshold": null` gates: now a group is one registered model, its
    configurations aliases, and a gate without a threshold registers nothing."""
    import polars as pl

    from tests.pipeline.test_recalibration import CONFIG, only_group

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=datetime(2026, 1, 1, tzinfo=UTC), estimators=("semantic_entropy",))
        group = only_group(store)
        make_live(store, group, CONFIG.model_copy(update={"alphas": [0.001, 0.3, 0.4]}))
        live = gates(store).filter(state="live")
        nothing = gates(store).filter(state="unattainable").to_dicts()
    serving = live.filter(pl.col("threshold").is_not_null()).to_dicts()
    assert nothing and len(serving) == live.height >= 2  # α = 0.001 is unattainable on 400 questions: not live
    result = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    assert "not registered" in result.output and len(result.output.splitlines()) <= 2 + len(serving)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    models = client.search_registered_models()
    assert [m.name for m in models] == [registered_name(serving[0])]  # one model for the group
    versions = client.search_model_versions(f"name = '{models[0].name}'")
    assert sorted(v.tags["cic.gate_id"] for v in versions) == sorted(r["calibration_id"] for r in serving)
    assert set(models[0].aliases) == {live_alias(r) for r in serving}  # no alias for the unattainable α
    for row in serving:
        version = client.get_model_version_by_alias(models[0].name, live_alias(row))
        assert version.tags["cic.alpha"] == f"{row['alpha']:g}" and version.tags["cic.state"] == "serving"


def test_sync_re_certifies_and_takes_the_alias_from_a_gate_the_store_no_longer_certifies(tmp_path: Path,
                                                                                           uri: str) -> None:
    """Labels under a live gate flipped behind the store's back (no label event): the export refuses the gate, and
    `cic gate sync` no longer re-asserts its alias — it re-certifies first, tags the version withdrawn, removes the
    alias and says which gate and why."""
    from tests.support.database import raw_sql

    db = tmp_path / "g.duckdb"
    (row,) = live_store(db, ("m",))
    assert registry_sync(str(db), uri, None) == [f"{registered_name(row)}@{live_alias(row)}"]
    raw_sql(db, "UPDATE labels SET aligned = NOT aligned WHERE question_id < 'q00100'")
    synced = runner.invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri])
    assert synced.exit_code == 0, synced.output
    said = " ".join(synced.output.split())
    assert f"withdrawn in the registry: gate {row['calibration_id'][:12]}" in said
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    (version,) = client.search_model_versions(f"name = '{registered_name(row)}'")
    assert version.tags["cic.state"] == "withdrawn" and not client.get_registered_model(version.name).aliases
