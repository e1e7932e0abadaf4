"""`cic run` and `cic recalibrate` own the processes they start (Prefect's ephemeral server, a local Ray): they
stop when the command exits, on SIGTERM, and — after a SIGKILL, which no handler sees — within seconds, stopped
by a watchdog process (`cic.services.watchdog`) that follows the command's process tree and outlives it.

As a second net, a small JSON file per store (keyed by the store's absolute path) records the run's own PID and
its descendants with their start times (so a recycled PID is never mistaken for one of ours); the next command
on the same store stops whatever a killed run left if the watchdog itself was killed too.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cic import schema
from cic.llm.paths import cache_root
from cic.services.watchdog import stop

WATCHDOG_READY_S = 30.0  # how long a command waits for its watchdog to hold it (seconds; a loaded machine is slow)


def record_path(db: str | Path, state_dir: str | Path | None = None, command: str = "run") -> Path:
    """Where the PIDs of a `command` on `db` are recorded ($CIC_CACHE_DIR/runs by default); each command has
    its own record, so a recalibration never overwrites a running pipeline's."""
    base = cache_root(state_dir)
    name = schema.value_hash(str(Path(db).expanduser().resolve()))[:16]
    return base / "runs" / (f"{name}.json" if command == "run" else f"{name}.{command}.json")


def _identity(proc: Any) -> dict[str, Any]:
    return {"pid": proc.pid, "started": proc.create_time(), "name": proc.name()}


def _alive(entry: dict[str, Any]) -> Any:
    """The process of a record entry if it is still the same process (same PID and start time)."""
    import psutil

    try:
        proc = psutil.Process(entry["pid"])
        return proc if abs(proc.create_time() - entry["started"]) < 0.01 and proc.is_running() else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError):
        return None


class OwnedProcesses:
    """Record, reap and stop the processes of one `cic run` on one store."""

    def __init__(self, db: str | Path, state_dir: str | Path | None = None, command: str = "run") -> None:
        import psutil

        self.path = record_path(db, state_dir, command)
        self.me = psutil.Process()
        self.before = {p.pid for p in self.me.children(recursive=True)}  # not ours: running before we started

    def reap_stale(self) -> list[int]:
        """Stop what a killed earlier run left behind (its main process gone, its children still running)."""
        if not self.path.exists():
            return []
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.path.unlink(missing_ok=True)
            return []
        if _alive(record.get("main", {})) is not None:
            return []  # that run is still going: not ours to stop
        left = [p for p in (_alive(e) for e in record.get("children", [])) if p is not None]
        stop(left)
        self.path.unlink(missing_ok=True)
        return [p.pid for p in left]

    def start_watchdog(self) -> Any:
        """The supervisor that stops our descendants when we die (its own session: a signal to our process
        group does not reach it). Returns once it holds us (its READY line), or after WATCHDOG_READY_S."""
        import select
        import subprocess
        import sys

        from cic.services import watchdog

        proc = subprocess.Popen([sys.executable, "-P", watchdog.__file__, str(self.me.pid),
                                 repr(self.me.create_time())], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, text=True)
        with proc.stdout:
            if select.select([proc.stdout], [], [], WATCHDOG_READY_S)[0]:
                proc.stdout.readline()  # READY, or nothing if it could not start: the record is the second net
        return proc

    def record(self) -> None:
        """Write our PID and our descendants' (call again as services start)."""
        import psutil

        children = []
        for proc in self.me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                children.append(_identity(proc))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps({"main": _identity(self.me), "children": children}))
        partial.replace(self.path)

    def stop_all(self) -> None:
        """Stop every descendant started since we began and forget the record."""
        stop([p for p in self.me.children(recursive=True) if p.pid not in self.before])
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def owned_processes(db: str | Path, state_dir: str | Path | None = None, command: str = "run",
                    before_stop: Callable[[], None] | None = None) -> Iterator[OwnedProcesses]:
    """Reap a killed run's leftovers, turn SIGTERM into a clean exit, and stop our children on the way out —
    after `before_stop` (leave Ray, flush Prefect's queues) while they still answer."""
    owner = OwnedProcesses(db, state_dir, command)
    owner.reap_stale()
    watchdog = owner.start_watchdog()
    owner.record()

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    import threading

    previous = signal.signal(signal.SIGTERM, on_term)
    done = threading.Event()

    def keep_recording() -> None:  # services start mid-run (Prefect's server, Ray): record them as they appear
        while not done.wait(2.0):
            with contextlib.suppress(Exception):
                owner.record()

    recorder = threading.Thread(target=keep_recording, name="cic-owned-processes", daemon=True)
    recorder.start()
    try:
        yield owner
    finally:
        done.set()
        recorder.join(timeout=5)
        signal.signal(signal.SIGTERM, previous)
        try:
            if before_stop is not None:
                before_stop()
        finally:
            owner.stop_all()
        with contextlib.suppress(Exception):
            watchdog.wait(timeout=5)
