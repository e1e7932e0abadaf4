"""A real `prefect server start` on loopback (no UI, own PREFECT_HOME), one per test session, for tests that
read back what the server holds and for flow processes that need no server of their own; `server` gives a test
the environment a client process needs (PREFECT_API_URL, its own PREFECT_HOME and MLflow store)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prefect server for the whole test session (its start takes 10-20 s); yields its API URL. Tests
    that share it keep their own state apart: their own flow runs, deployments and limits, read back by id."""
    root = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(root), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "true", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with (root / "server.log").open("w") as log:
        proc = subprocess.Popen([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    wait_healthy(url, proc, root / "server.log")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def server(prefect_api: str, tmp_path: Path) -> dict[str, str]:
    """The environment a client process of the shared server needs: its API URL, a PREFECT_HOME and an MLflow
    store of this test's own."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(tmp_path / "prefect-client"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT)}
    return env


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    """Wait until `url`/health answers; fail the test with the server's log if it dies or never answers."""
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"prefect server did not start: {log.read_text()[-2000:]}")
        time.sleep(1)
