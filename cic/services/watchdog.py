"""The supervisor that dies with a command: started by `owned_processes`, it watches the command's process tree
every half second and, the moment the command is gone — even by SIGKILL, which no handler sees — stops every
process the command had started (Prefect's server, Ray's agents and their workers), then exits.

It runs as a plain script that imports only the standard library and psutil (importing `cic` takes seconds on a
loaded machine, and a command killed in those seconds would leave its children behind), and it prints one
`READY` line once it holds the command and has listed its children: the command waits for that line.

    python -P .../cic/services/watchdog.py PID START_TIME
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

POLL_S = 0.5
READY = "READY"


def stop(processes: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `grace_s` (Ray agents ignore SIGTERM)."""
    import psutil

    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, left = psutil.wait_procs(processes, timeout=grace_s)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=grace_s)


def _same(proc: Any, started: float) -> bool:
    import psutil

    try:
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _list_children(owner: Any, me: int, known: dict[int, float]) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in owner.children(recursive=True):
            if child.pid != me:
                with contextlib.suppress(psutil.Error):
                    known.setdefault(child.pid, child.create_time())


def watch(pid: int, started: float, poll_s: float = POLL_S, ready: Any = None) -> list[int]:
    """Follow `pid`'s descendants until it ends, then stop those still running; returns the PIDs stopped.
    `ready` is called once the owner is held and its children listed."""
    import os

    import psutil

    me = os.getpid()
    try:
        owner = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    known: dict[int, float] = {}
    _list_children(owner, me, known)
    if ready is not None:
        ready()
    while _same(owner, started):
        time.sleep(poll_s)
        _list_children(owner, me, known)
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


def _say_ready() -> None:
    with contextlib.suppress(OSError):
        print(READY, flush=True)
        sys.stdout.close()  # one line only: the command closes its end, and a later write would be refused


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal's group is the command's to handle
    watch(int(sys.argv[1]), float(sys.argv[2]), ready=_say_ready)
