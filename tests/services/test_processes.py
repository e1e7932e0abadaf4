"""`cic run` owns what it starts: children stop on SIGTERM, and a SIGKILL's leftovers at the next start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cic.services.processes import OwnedProcesses, record_path

pytestmark = pytest.mark.slow  # starts and kills process trees

SLEEPER = "import time; time.sleep(600)"


def _spawn_family(tmp_path: Path, db: Path) -> tuple[subprocess.Popen, list[int]]:
    """A parent that records itself and two children (one ignoring SIGTERM, like Ray's agents), then waits."""
    code = (
        "import signal, subprocess, sys, time\n"
        "from cic.services.processes import OwnedProcesses\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]),\n"
        "        subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])]\n"
        f"owner = OwnedProcesses({str(db)!r}, {str(tmp_path)!r}); owner.record()\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True); time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    kids = [int(p) for p in parent.stdout.readline().split()]
    time.sleep(0.5)  # let the ignoring child install its handler
    return parent, kids


@pytest.mark.faults
def test_the_next_start_stops_what_a_killed_run_left(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    parent, kids = _spawn_family(tmp_path, db)
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert all(psutil.pid_exists(k) for k in kids)  # orphans: what a kill -9 leaves today
        reaped = OwnedProcesses(db, tmp_path).reap_stale()
        assert sorted(reaped) == sorted(kids)
        assert not any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE for k in kids)
        assert not record_path(db, tmp_path).exists()
    finally:
        for pid in kids:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


@pytest.mark.faults
def test_a_live_run_is_not_touched_and_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    parent, kids = _spawn_family(tmp_path, db)
    try:
        assert OwnedProcesses(db, tmp_path).reap_stale() == []  # its main process is alive
        assert all(psutil.pid_exists(k) for k in kids)
    finally:
        parent.kill()
        parent.wait()
        for pid in kids:
            psutil.Process(pid).kill()
    record = record_path(db, tmp_path)
    text = record.read_text().replace('"started": ', '"started": 1')  # same PIDs, other start times
    record.write_text(text)
    assert OwnedProcesses(db, tmp_path).reap_stale() == []


@pytest.mark.faults
def test_sigterm_stops_the_children_with_the_run(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "from cic.services.processes import owned_processes\n"
        f"with owned_processes({str(tmp_path / 's.duckdb')!r}, {str(tmp_path)!r}):\n"
        "    kids = [subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']) for _ in range(2)]\n"
        "    print(' '.join(str(k.pid) for k in kids), flush=True); time.sleep(600)\n")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    kids = [int(p) for p in run.stdout.readline().split()]
    time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    assert not any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE for k in kids)
    assert not record_path(tmp_path / "s.duckdb", tmp_path).exists()


def _gone(pids: list[int], within_s: float) -> list[int]:
    """The PIDs still running (not zombies) after waiting up to `within_s` seconds for them to end."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _command_line(proc: psutil.Process) -> str | None:
    """A process's command line, or None when it has ended since it was listed."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return None


@pytest.mark.faults
def test_a_command_killed_the_moment_it_owns_its_processes_still_has_them_stopped(tmp_path: Path) -> None:
    """`owned_processes` returns only once the watchdog holds the command: a SIGKILL right after it (no poll in
    between) still stops the child the command had."""
    code = (
        "import os, signal, subprocess, sys\n"
        "from cic.services.processes import owned_processes\n"
        f"kid = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        f"with owned_processes({str(tmp_path / 's.duckdb')!r}, {str(tmp_path)!r}):\n"
        "    print(kid.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    kid = int(run.stdout.readline())
    try:
        assert run.wait(timeout=30) == -signal.SIGKILL
        assert _gone([kid], within_s=10) == []
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(kid).kill()


@pytest.mark.faults
def test_after_kill_9_the_watchdog_stops_every_child_within_seconds(tmp_path: Path) -> None:
    """No later command needed: the supervisor outlives the killed command and stops its process tree,
    grandchildren and a child that ignores SIGTERM included."""
    code = (
        "import subprocess, sys, time\n"
        "from cic.services.processes import owned_processes\n"
        f"with owned_processes({str(tmp_path / 's.duckdb')!r}, {str(tmp_path)!r}):\n"
        "    stubborn = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
        "    grandparent = ('import subprocess, sys, time; '\n"
        "                   'subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); '\n"
        "                   'time.sleep(600)')\n"
        "    kids = [subprocess.Popen([sys.executable, '-c', stubborn]),\n"
        "            subprocess.Popen([sys.executable, '-c', grandparent])]\n"
        "    print(' '.join(str(k.pid) for k in kids), flush=True); time.sleep(600)\n")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    tree: list[int] = []
    try:
        kids = [int(p) for p in run.stdout.readline().split()]
        time.sleep(2.0)  # the grandchild starts and the watchdog's next look finds it
        lines = {p.pid: _command_line(p) for p in psutil.Process(run.pid).children(recursive=True)}
        tree = [pid for pid, line in lines.items() if line is not None]  # not one that ended as it was listed
        watchdogs = [p for p in tree if "cic/services/watchdog.py" in lines[p]]
        assert len(watchdogs) == 1 and set(kids) < set(tree) and len(tree) >= 4
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        assert _gone([p for p in tree if p not in watchdogs], within_s=10) == []
        assert _gone(watchdogs, within_s=10) == []  # and the watchdog itself is gone
    finally:  # only this test's own processes: the session's shared servers are children of pytest too
        run.kill()
        for pid in tree:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
