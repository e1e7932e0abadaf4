"""A system's MLflow run, read back from a real (SQLite) tracking store: coverage, system FDR and each stage's share
against α, every stage's threshold in the per-α table, logged once however often the pass runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cic.pipeline.config import CalibrationConfig, CascadeConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.services.mlflow_layout import system_groups
from cic.services.mlflow_tracking import log_group
from cic.store import Store
from tests.support.pipeline_data import store_run

pytestmark = pytest.mark.slow  # logs to MLflow stores

CONFIG = CalibrationConfig(alphas=(0.1, 0.2), bounds=("cp",), n_splits=6,
                           cascades=(CascadeConfig(name="small-big", models=("small", "big"),
                                                   estimator="semantic_entropy"),))


def test_a_cascade_run_shows_coverage_fdr_and_shares_against_alpha(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=500, seed=1, error_slope=0.9, base=0.05),
                store_run(store, model="big", n=500, seed=2, error_slope=0.4, base=0.01)]
    calibrate_store(str(db), keys, CONFIG)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    with Store.open(db, read_only=True) as store:
        (group,) = system_groups(store, keys, "cic-t")
        assert system_groups(store, ["other"], "cic-t") == []
    run_id, new = log_group(client, group)
    assert new and log_group(client, group) == (run_id, False)  # a second pass finds it
    run = client.get_run(run_id)
    assert run.data.tags["cic.kind"] == "system" and run.info.run_name == "small-big (cascade small -> big) · " \
                                                                         "similarity[0.6]"
    coverage = {m.step: m.value for m in client.get_metric_history(run_id, "coverage_by_alpha_pct.cp.fallback")}
    shares = {m.step: m.value for m in client.get_metric_history(run_id, "share.small_by_alpha_pct.cp.fallback")}
    assert set(coverage) == set(shares) == {10, 20} and all(0 <= shares[s] <= coverage[s] for s in shares)
    table = json.loads(Path(client.download_artifacts(run_id, "per_alpha.json", str(tmp_path))).read_text())
    columns = table["columns"]
    assert {"threshold.small", "threshold.big", "share.small", "share.big", "fdr_mean", "coverage_mean"} <= set(columns)
    assert len(table["data"]) == 2
    assert pytest.approx(float(run.data.metrics["certified_gates"])) == sum(
        row[columns.index("certified")] for row in table["data"])


def test_the_registry_holds_a_live_system_gate_as_one_version_with_every_threshold_and_drops_its_alias_when_withdrawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cic gate sync`'s function against a real SQLite registry: the live cascade gate is one version of
    `cic-system.…`, tagged with both stages' thresholds, its file the served entry; flagged, the alias goes."""
    from mlflow.artifacts import download_artifacts

    from cic.pipeline.gates.lifecycle import flag_gates
    from cic.pipeline.gates.system_gates import system_gates
    from cic.services.registry_sync import registry_sync

    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=500, seed=1, error_slope=0.9, base=0.05),
                store_run(store, model="big", n=500, seed=2, error_slope=0.4, base=0.01)]
    calibrate_store(str(db), keys, CONFIG)
    with Store.open(db, read_only=True) as store:
        live = system_gates(store, system="small-big").filter(state="live", alpha=0.2).row(0, named=True)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what a serving system reading `models:/…` has set
    names = registry_sync(str(db), uri, None)
    (mine,) = [n for n in names if n.startswith("cic-system.small-big.d.") and n.endswith("-a0p2-d0p05")]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    name, alias = mine.split("@")
    version = client.get_model_version_by_alias(name, alias)
    assert version.tags["cic.gate_id"] == live["calibration_id"] and version.tags["cic.models"] == "small -> big"
    assert json.loads(version.tags["cic.thresholds"]) == pytest.approx(live["thresholds"])
    gate = json.loads(Path(download_artifacts(f"models:/{mine}", dst_path=str(tmp_path / "dl")))
                      .joinpath("system_gate.json").read_text())
    assert gate["thresholds"] == pytest.approx(live["thresholds"]) and gate["models"] == ["small", "big"]
    assert sorted(registry_sync(str(db), uri, None)) == sorted(names)  # idempotent
    assert len(client.search_model_versions(f"name = '{name}'")) == 2  # alpha 0.1 and 0.2, once each
    with Store.open(db) as store:
        flag_gates(store, {live["calibration_id"]: "error rate at the live thresholds … (test)"})
    after = registry_sync(str(db), uri, [live["calibration_id"]])
    assert mine not in after
    assert client.get_model_version(name, version.version).tags["cic.state"] == "withdrawn"


@pytest.mark.parametrize(("column", "value"), [
    ("estimators", "['predictive_entropy', 'predictive_entropy']"), ("n_errors", "n_errors + 1"),
    ("bound_value", "bound_value / 2"), ("guarantee", "'P(error among answered <= alpha) >= 0.999'"),
    ("search", "'holm'"), ("shares", "[0.5, 0.5]")])
def test_an_edited_field_of_a_system_gate_is_served_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            column: str, value: str) -> None:
    """Each served field of a live cascade gate edited behind the store's back: the export and the cascade's ask
    path refuse it in one line, and `cic gate sync` re-certifies before aliasing — the version is tagged
    withdrawn, no alias serves it, and the refusal names the column."""
    from cic.errors import UserError
    from cic.pipeline.gates.serving import live_gate
    from cic.pipeline.gates.system_gates import system_gates
    from cic.services.registry_sync import registry_sync
    from tests.support.database import raw_sql
    from tests.support.pipeline_data import served_systems

    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=500, seed=1, error_slope=0.9, base=0.05, estimators=(
                    "semantic_entropy", "predictive_entropy")),
                store_run(store, model="big", n=500, seed=2, error_slope=0.4, base=0.01, estimators=(
                    "semantic_entropy", "predictive_entropy"))]
    calibrate_store(str(db), keys, CONFIG)
    with Store.open(db, read_only=True) as store:
        live = system_gates(store).filter(state="live", certified=True).sort("alpha").row(-1, named=True)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert registry_sync(str(db), uri, None)  # aliased while it certifies
    raw_sql(db, f"UPDATE calibrations SET {column} = {value} WHERE calibration_id = '{live['calibration_id']}'")
    with Store.open(db, read_only=True) as store:  # its key serves nothing, naming the column; the export goes on
        (entry,) = [e for e in served_systems(store) if e.get("flagged_gate_id") == live["calibration_id"]]
        assert entry["serve"] == "nothing" and f"column {column} = " in entry["reason"]
        with pytest.raises(UserError, match=f"column {column} = "):
            live_gate(store, system="small-big", dataset="d", criterion=None, alpha=live["alpha"],
                                bound="cp")
    refused: dict[str, str] = {}
    registry_sync(str(db), uri, None, refused=refused)
    assert f"column {column} = " in refused[live["calibration_id"]]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    (version,) = client.search_model_versions(f"tags.`cic.gate_id` = '{live['calibration_id']}'")
    assert version.tags["cic.state"] == "withdrawn"
    aliases = client.get_registered_model(version.name).aliases or {}
    assert str(version.version) not in {str(v) for v in aliases.values()}


@pytest.mark.slow
def test_a_recalibration_logs_a_cascades_candidate_its_drift_tests_and_the_live_gate_it_would_replace(
        tmp_path: Path) -> None:
    """A live cascade whose second model drifts: the pass's MLflow run for the cascade's key — as for a single
    model's group — says drift was found (the tag on-call filters by), counts the alerts, and its table shows the
    candidate's per-stage thresholds beside the live gate's, the live gate's monitor and the alerts."""
    from datetime import UTC, datetime, timedelta

    from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
    from cic.services.mlflow_results import log_recalibration

    day = datetime(2026, 1, 1, tzinfo=UTC)
    config = CalibrationConfig(alphas=(0.2,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4,
                               cascades=(CascadeConfig(name="small-big", models=("small", "big"),
                                                       estimator="semantic_entropy"),))
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=600, seed=1, error_slope=0.9, base=0.05, labelled_at=day),
                store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01, labelled_at=day)]
    calibrate_store(str(db), keys, config)
    with Store.open(db) as store:
        for model, seed, base in (("small", 12, 0.05), ("big", 22, 0.6)):  # the strong model now errs often
            store_run(store, model=model, n=400, seed=seed, error_slope=0.9 if model == "small" else 0.4,
                      base=base, id_offset=600, labelled_at=day + timedelta(days=2))
        result = recalibrate_store(store, keys, config, 0.05, WindowRule())
    (candidate,) = result.systems
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    runs = {client.get_run(i).data.tags["cic.model"]: client.get_run(i)
            for i in log_recalibration(result, tracking=uri, experiment_prefix="cic-sys")}
    run = runs["small -> big"]
    assert run.data.tags["cic.kind"] == "recalibration" and run.data.tags["cic.shift_detected"] == "true"
    assert run.data.tags["cic.system"] == "small-big" and run.data.metrics["alerts"] >= 1
    assert run.data.metrics["certified_gates"] + run.data.metrics["unattainable_gates"] == 1
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "per_alpha.json", str(tmp_path))).read_text())
    (row,) = [dict(zip(table["columns"], values, strict=True)) for values in table["data"]]
    live = candidate.live
    assert row["gate_id"] == candidate.row.calibration_id and row["live_gate_id"] == live.calibration_id
    assert row["live_threshold"] == " / ".join("never" if t is None else f"{t:.6g}" for t in live.thresholds)
    assert row["alerts"] == " | ".join(candidate.alerts) and row["n_alerts"] == len(candidate.alerts) >= 1
    assert row["live_monitor_answered"] > 0
    with Store.open(db, read_only=True) as store:  # `cic log` logs the pipeline's system run, not the candidate again
        (pipeline_run,) = system_groups(store, keys, "cic-sys")
    assert pipeline_run.tags["cic.data_fingerprint"] == live.data_fingerprint
