"""A system's MLflow run, read back from a real (SQLite) tracking store: coverage, system FDR and each stage's share
against α, every stage's threshold in the per-α table, logged once however often the pass runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cic.pipeline.calibrate_store import calibrate_store
from cic.pipeline.config import CalibrationConfig, CascadeConfig
from cic.services.mlflow_layout import system_groups
from cic.services.mlflow_tracking import log_group
from cic.store import Store
from tests.support.pipeline_data import store_run

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
