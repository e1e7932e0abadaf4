"""An anytime pass in MLflow, read back from a real (SQLite) tracking store: the run of each group holds the
certified threshold, its counts and state per α, and says it has no batch bound (an e-process certified it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from mlflow import MlflowClient

from cic.pipeline.config import CalibrationConfig
from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
from cic.services.mlflow_layout import E_PROCESS
from cic.services.mlflow_results import log_recalibration
from cic.store import Store
from tests.support.pipeline_data import store_run


def test_each_anytime_pass_logs_the_certified_threshold_and_its_coverage(tmp_path: Path) -> None:
    with Store.open(tmp_path / "t.duckdb") as store:
        key = store_run(store, n=1000, seed=1, base=0.02, error_slope=0.3, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
        result = recalibrate_store(store, [key], CalibrationConfig(alphas=(0.2,)), 0.05, WindowRule(), anytime_grid=20)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ids = log_recalibration(result, tracking=uri, experiment_prefix="cic-any")
    client = MlflowClient(tracking_uri=uri)
    made = {c.row.estimator: c.row for c in result.candidates}
    assert len(ids) == len(made) == 2
    for run_id in ids:
        run = client.get_run(run_id)
        table = json.loads(Path(client.download_artifacts(run_id, "per_alpha.json", str(tmp_path))).read_text())
        (row,) = [dict(zip(table["columns"], values, strict=True)) for values in table["data"]]
        gate = made[run.data.tags["cic.estimator"]]
        assert (row["search"], row["bound"], row["state"]) == ("anytime", "e-process", "live")
        assert row["threshold"] == round(gate.threshold, 10) and row["ucb"] == E_PROCESS
        assert row["n_cal"] == 1000 and 0 < row["n_accepted"] <= 1000  # coverage: n_accepted / n_cal
        assert run.data.metrics["certified_gates"] == 1
