"""A real `prefect server start` on loopback (no UI, own PREFECT_HOME), one per test run — shared by the xdist
workers — for tests that read back what the server holds and for flow processes that need no server of their
own; `server` gives a test the environment a client process needs (PREFECT_API_URL, its own PREFECT_HOME and
MLflow store)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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
    """Start the session's server before the first test when the session runs flows (`PREFECT_USERS`)."""
    if any(item.nodeid.startswith(PREFECT_USERS) for item in request.session.items):
        request.getfixturevalue("prefect_api")


def _shared_dir(factory: pytest.TempPathFactory) -> Path:
    """The folder all processes of this test run share: the controller's base temp (an xdist worker's parent)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prefect server for the whole test run (its start takes 10-20 s of CPU, and each idle server more):
    the first worker to need it starts it, the others find its URL; yields the API URL. Tests that share it keep
    their own state apart: their own flow runs, deployments and limits, read back by id."""
    root = _shared_dir(tmp_path_factory) / "prefect-server"
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starts it; the others wait here for its URL
        if not (root / "url").exists():
            _start(root)
    url = (root / "url").read_text()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # the flows this test process runs itself report here too, instead of to an ephemeral server of its own (one
    # server process fewer per worker); subprocesses still choose theirs by their own environment
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
        if not os.environ.get("PYTEST_XDIST_WORKER"):  # alone, this process is the last user: it stops the server
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)  # after the run logs still on their way to it
            stop_shared_server(root)  # (under xdist the controller stops it, once every worker has exited)


def _start(root: Path) -> None:
    """Start the server in its own session, wait until it answers, then record its pid and URL in `root`."""
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
    (root / "pid").write_text(str(proc.pid))
    (root / "url").write_text(url)
    _STARTED.append(proc)  # kept: its Popen must not be collected while the server runs


_STARTED: list[subprocess.Popen] = []


def stop_shared_server(root: Path) -> None:
    """Terminate the server recorded in `root` (its whole process group), SIGKILL after 20 s; no-op if none."""
    try:
        pid = int((root / "pid").read_text())
    except (OSError, ValueError):
        return
    (root / "url").unlink(missing_ok=True)
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for proc in _STARTED:
        if proc.pid == pid:
            proc.wait(timeout=20)


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie no longer counts)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pytest_unconfigure(config: pytest.Config) -> None:
    """The xdist controller stops the server its workers shared, once they have all finished."""
    if getattr(config, "workerinput", None) is None and getattr(config.option, "numprocesses", None):
        factory = getattr(config, "_tmp_path_factory", None)
        if factory is not None:
            stop_shared_server(factory.getbasetemp() / "prefect-server")


@pytest.fixture
def server(prefect_api: str, tmp_path: Path) -> dict[str, str]:
    """The environment a client process of the shared server needs: its API URL, a PREFECT_HOME and an MLflow
    store of this test's own."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(tmp_path / "prefect-client"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT)}
    return env
