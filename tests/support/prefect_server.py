"""A real `prefect server start` on loopback (no UI, own PREFECT_HOME), one per test session, for tests that
read back what the server holds and for flow processes that need no server of their own; `server` gives a test
the environment a client process needs (PREFECT_API_URL, its own PREFECT_HOME and MLflow store)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.local_servers import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"


# the suites whose tests run flows, in this process or in the processes they start: a session holding any of them
# starts the shared server first, so no test process starts an ephemeral Prefect server of its own
PREFECT_USERS = ("tests/flows/", "tests/cli/", "tests/journeys/")

# the server's background services no test needs (runs are created directly, never from a schedule; nothing is
# paused, cancelled, late, or automated): each wakes every few seconds and costs CPU the suite needs
SERVICES_OFF = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "TRIGGERS")


@pytest.fixture(scope="session", autouse=True)
def _prefect_first(request: pytest.FixtureRequest) -> None:
    """Start the session's server before the first test when the session runs flows with services (a slow test of
    `PREFECT_USERS`); the fast tier starts none (a fast test that runs a flow gets Prefect's ephemeral API)."""
    if any(item.nodeid.startswith(PREFECT_USERS) and item.get_closest_marker("slow")
           for item in request.session.items):
        request.getfixturevalue("prefect_api")


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prefect server for the whole test session (its start takes 10-20 s); yields its API URL. Tests
    that share it keep their own state apart: their own flow runs, deployments and limits, read back by id."""
    root = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(root), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "true", "PREFECT_UI_ENABLED": "false",
           **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in SERVICES_OFF}}
    env.pop("PREFECT_API_URL", None)
    with (root / "server.log").open("w") as log:
        proc = subprocess.Popen([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    wait_healthy(f"{url}/health", proc, 150, lambda: (root / "server.log").read_text()[-2000:])
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # the flows this test process runs itself report here too, instead of to an ephemeral server of its own (one
    # server process fewer per worker); subprocesses still choose theirs by their own environment
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)  # the run logs still on their way, before the server stops
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


def api_post(api: str, path: str, body: dict[str, Any]) -> Any:
    """One POST to a Prefect server's REST API (what its UI reads), decoded."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())
