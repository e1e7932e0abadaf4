"""A real `prefect server start` on loopback: serve the recalibration deployment on a cron schedule, trigger it
on a quiet week (the run completes, candidates logged to MLflow) and on a drifted one (the run ends Failed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from cic.pipeline.gates import gates
from cic.pipeline.stored_calibration import groups_of_run
from cic.store import Store
from tests.support.pipeline_data import store_run, write_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"

TRIGGER = """
import sys, time
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
name = "cic-recalibrate/recalibrate-nightly"
deadline = time.time() + 120
with get_client(sync_client=True) as client:
    while True:
        try:
            deployment = client.read_deployment_by_name(name)
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(1)
print("CRON", deployment.schedules[0].schedule.cron)
run = run_deployment(name, timeout=300)
print("STATE", run.state.type.value, run.state.message)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "true", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 150
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"prefect server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
        time.sleep(1)
    client_env = {**env, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "prefect-client"),
                  "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT)}
    yield client_env
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _trigger(server: dict[str, str], tmp_path: Path) -> str:
    trigger = subprocess.run([sys.executable, "-c", TRIGGER], env=server, cwd=ROOT, capture_output=True, text=True,
                             timeout=420)
    assert trigger.returncode == 0, trigger.stderr[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
    assert "CRON 0 3 * * *" in trigger.stdout
    return trigger.stdout


def test_served_recalibration_completes_on_a_quiet_week_and_fails_on_drift(server: dict[str, str],
                                                                          tmp_path: Path) -> None:
    from cic.pipeline.config import CalibrationConfig
    from tests.pipeline.test_recalibration import make_live

    db = tmp_path / "cic.duckdb"
    calibration = CalibrationConfig(alphas=(0.3,), bounds=("hoeffding", "cp"), searches=("paper",), n_splits=10)
    with Store.open(db) as store:  # week 1 behind the live gates, then a quiet week 2
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
        run = store.read("runs").row(0, named=True)
        for group in groups_of_run(store, run):
            make_live(store, group, calibration)
        store_run(store, n=300, labelled_at=datetime(2026, 1, 8, tzinfo=UTC), id_offset=1000, seed=1)
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", alphas=[0.3])
    serve = (f"from flows.recalibrate import recalibrate_flow\n"
             f"recalibrate_flow.serve(name='recalibrate-nightly', cron='0 3 * * *', pause_on_shutdown=False, "
             f"parameters={{'config_path': {str(config)!r}}})\n")
    serve_log = (tmp_path / "serve.log").open("w")
    runner = subprocess.Popen([sys.executable, "-c", serve], env=server, cwd=ROOT, stdout=serve_log,
                              stderr=subprocess.STDOUT)
    try:
        quiet = _trigger(server, tmp_path)
        with Store.open(db) as store:  # week 3: scores moved and every answer is wrong
            store_run(store, n=300, labelled_at=datetime(2026, 1, 15, tzinfo=UTC), id_offset=2000, seed=2,
                      shift=0.5, base=1.0)
        drifted = _trigger(server, tmp_path)
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    assert "STATE COMPLETED" in quiet, quiet + (tmp_path / "serve.log").read_text()[-3000:]
    assert "STATE FAILED" in drifted, drifted + (tmp_path / "serve.log").read_text()[-3000:]
    with Store.open(db) as store:
        recalibrated = gates(store, kind="recalibration")
    assert recalibrated.height == 2 * 2 * 2 and set(recalibrated["state"]) == {"candidate"}
    assert recalibrated.filter(pl.col("n_cal") == 600)["alerts"].list.len().min() > 0  # weeks 2+3: drift
    client = MlflowClient(tracking_uri=server["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("cic-t-d")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`cic.kind` = 'recalibration'")
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 4
