"""A real `mlflow server` on loopback with its own SQLite backend and artifact folder, that a test can kill
and start again on the same port and stores (an outage, then recovery)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise RuntimeError("mlflow server did not start within 120 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import os

            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
