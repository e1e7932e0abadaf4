"""A real `mlflow server` on loopback with its own SQLite backend and artifact folder, that a test can kill
and start again on the same port and stores (an outage, then recovery)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.local_servers import free_port, kill_group, wait_healthy


class MlflowServer:
    """`start()` waits (≤ 120 s) until /health answers; `kill()` is a SIGKILL of the whole server group."""

    def __init__(self, root: Path, *, backend: str | None = None, artifacts: Path | None = None) -> None:
        """Stores under `root` (server.db, server-artifacts/) unless `backend` (a URI) / `artifacts` say."""
        self.root, self.port = root, free_port()
        self.backend = backend or f"sqlite:///{root}/server.db"
        self.artifacts = artifacts or root / "server-artifacts"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> MlflowServer:
        exe = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(exe), "server", "--backend-store-uri", self.backend, "--artifacts-destination", str(self.artifacts),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_healthy(f"{self.url}/health", self.proc, 120, lambda: "see the server's output")
        return self

    def kill(self) -> None:
        kill_group(self.proc)
