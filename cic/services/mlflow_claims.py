"""One logger at a time per MLflow group: a claim (an exclusive file lock, keyed by tracking URI and log key)
held from "is this group logged?" to its run marked FINISHED. Two processes logging one store (two `cic
run`s without a Prefect server, a `cic log` beside a run) would otherwise both find the group unlogged and log it
twice — and each would take the other's RUNNING parent for a crashed one. The lock dies with its process, so a
killed logger leaves no claim behind: the next pass finds its RUNNING parent stale and replaces it. Runs that
share a DuckDB store share a host, which is what the lock covers."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cic.errors import UserError

CLAIM_WAIT_S = 1800.0  # longest wait for another process to finish logging the same group


def claim_path(tracking_uri: str, log_key: str) -> Path:
    digest = hashlib.sha256(f"{tracking_uri}\0{log_key}".encode()).hexdigest()[:32]
    return Path(tempfile.gettempdir()) / f"cic-mlflow-claims-{os.getuid()}" / f"{digest}.lock"


@contextmanager
def claimed(tracking_uri: str, log_key: str, wait_s: float = CLAIM_WAIT_S) -> Iterator[None]:
    """Hold the group's claim (filelock); waits (polling) while another process holds it, up to `wait_s`."""
    from filelock import FileLock, Timeout

    path = claim_path(tracking_uri, log_key)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        lock = FileLock(path, timeout=wait_s, poll_interval=0.2).acquire()
    except Timeout:
        raise UserError(f"MLflow group {log_key}: another process has been logging it for {wait_s:g} s "
                        "(its claim is held); try again when it is done") from None
    with lock:
        yield
