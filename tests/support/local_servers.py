"""What every real server a test starts on loopback shares: a free port, waiting for its health URL, and a
SIGKILL of its whole process group (a server killed as an outage would kill it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(health_url: str, proc: subprocess.Popen, timeout_s: float, why: Callable[[], str]) -> None:
    """Return once `health_url` answers 200; kill the group and raise (with `why()`) if `proc` exits or
    `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {why()}")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    kill_group(proc)
    raise RuntimeError(f"{proc.args[0]} did not answer {health_url} within {timeout_s:g} s: {why()}")


def kill_group(proc: subprocess.Popen | None) -> None:
    """SIGKILL the process group `proc` leads (started with start_new_session=True) and reap it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
