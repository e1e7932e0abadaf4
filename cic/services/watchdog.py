"""The supervisor that dies with a command: started by `owned_processes`, it watches the command's process tree
every half second and, the moment the command is gone — even by SIGKILL, which no handler sees — stops every
process the command had started (Prefect's server, Ray's agents and their workers), then exits.

    python -m cic.services.watchdog PID START_TIME
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

POLL_S = 0.5


def _same(proc: Any, started: float) -> bool:
    import psutil

    try:
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(pid: int, started: float, poll_s: float = POLL_S) -> list[int]:
    """Follow `pid`'s descendants until it ends, then stop those still running; returns the PIDs stopped."""
    import os

    import psutil

    from cic.services.processes import stop

    me = os.getpid()
    try:
        owner = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    known: dict[int, float] = {}
    while _same(owner, started):
        with contextlib.suppress(psutil.Error):
            for child in owner.children(recursive=True):
                if child.pid != me:
                    with contextlib.suppress(psutil.Error):
                        known.setdefault(child.pid, child.create_time())
        time.sleep(poll_s)
    left = []
    for child_pid, child_started in known.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(child_pid)
            if _same(proc, child_started):
                left.append(proc)
                left.extend(p for p in proc.children(recursive=True) if p.pid != me)
    unique = list({p.pid: p for p in left}.values())
    stop(unique, grace_s=3.0)
    return [p.pid for p in unique]


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal's group is the command's to handle
    watch(int(sys.argv[1]), float(sys.argv[2]))
