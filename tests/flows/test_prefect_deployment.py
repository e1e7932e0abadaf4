"""A real `prefect server start` on loopback: serve the recalibration deployment on a cron schedule, trigger a
run and see it complete (it recalibrates stored results and logs to MLflow)."""

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

import pytest
from mlflow import MlflowClient

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
print("STATE", run.state.type.value)
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


def test_served_recalibration_deployment_runs_to_completion(server: dict[str, str], tmp_path: Path) -> None:
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports")
    serve = (f"from flows.recalibrate import recalibrate_flow\n"
             f"recalibrate_flow.serve(name='recalibrate-nightly', cron='0 3 * * *', pause_on_shutdown=False, "
             f"parameters={{'config_path': {str(config)!r}, 'window': 200}})\n")
    serve_log = (tmp_path / "serve.log").open("w")
    runner = subprocess.Popen([sys.executable, "-c", serve], env=server, cwd=ROOT, stdout=serve_log,
                              stderr=subprocess.STDOUT)
    try:
        trigger = subprocess.run([sys.executable, "-c", TRIGGER], env=server, cwd=ROOT, capture_output=True,
                                 text=True, timeout=420)
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    assert trigger.returncode == 0, trigger.stderr[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
    assert "CRON 0 3 * * *" in trigger.stdout
    assert "STATE COMPLETED" in trigger.stdout, trigger.stdout + (tmp_path / "serve.log").read_text()[-3000:]
    with Store.open(db) as store:
        kinds = store.read("calibrations").get_column("kind").to_list()
    assert kinds and set(kinds) == {"recalibration"}
    client = MlflowClient(tracking_uri=server["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("cic-t-d")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`cic.kind` = 'recalibration'")
    assert runs
