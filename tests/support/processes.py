"""Reading other processes in tests without racing them: a process may exit or turn zombie between two looks."""
from __future__ import annotations

import psutil


def command_line(proc: psutil.Process) -> str:
    """The process's command line, or "" once it has exited or is a zombie (its command line is gone)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def still_running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of `procs` that run still (a zombie has exited; only its parent has not reaped it)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive
