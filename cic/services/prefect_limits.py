"""Flows that write one DuckDB store queue on a Prefect global concurrency limit instead of racing for its lock.

Every flow that writes the store holds one slot of the limit its config names (`storage.concurrency_limit`,
default "cic-store") while it runs; `prefect gcl create cic-store --limit 1` makes them run one after another
(a scheduled recalibration waits for a running pipeline). Without that limit on the server nothing is held, and
flows share the file by short write locks with bounded waits. The wait for a slot is bounded too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def store_slot(name: str | None, *, timeout_s: float = 24 * 3600) -> Iterator[None]:
    """Hold one slot of the global concurrency limit `name` (no-op when None or when the server has no such
    limit); a slot not free within `timeout_s` raises TimeoutError."""
    if not name or not limit_exists(name):
        yield
        return
    from prefect.concurrency.sync import concurrency

    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True):
        yield


def limit_exists(name: str) -> bool:
    """Whether the Prefect server has an active global concurrency limit of that name (quietly: no warning)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return bool(client.read_global_concurrency_limit_by_name(name).active)
        except ObjectNotFound:
            return False
