"""A real `prefect server start` on loopback (no UI, own PREFECT_HOME), for tests that read back what the
server holds; yields the environment a client process needs (PREFECT_API_URL and a separate PREFECT_HOME)."""

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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "true", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    wait_healthy(url, proc, tmp_path / "server.log")
    client_env = {**env, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "prefect-client"),
                  "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT)}
    yield client_env
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()




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
