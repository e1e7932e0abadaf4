"""Ray plumbing: join or start a cluster, place each model's replicas as its config says, drain every pool at once.

Placement comes from the config, not from what the cluster has right now: a replica that asks for
`gpus_per_replica` GPUs (fractional packs several small models on one GPU) is requested as such, so an autoscaler
sees GPU demand and adds GPU nodes. Every wait is bounded: a replica that does not start within
`ready_timeout_s` fails its model (or, only when the config allows it, restarts on CPU); a batch that does not
return within `batch_timeout_s` is taken as lost and retried. One model's failure never stops the others.
Workers return data (Arrow batches); they never touch DuckDB.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from cic.errors import UserError
from cic.pipeline.run.preflight import check_ray_address

log = logging.getLogger("cic.ray")
POLL_S = 5.0  # how often a drain with nothing finished checks its deadlines


@dataclass(frozen=True)
class ClusterInfo:
    """What the driver joined: the address ("local" for an in-process cluster) and its resources."""

    address: str
    started_here: bool
    cpus: float
    gpus: float
    joined_here: bool = True   # this call joined (a caller that had joined already keeps its connection)


def connect(address: str | None = None, *, num_cpus: int | None = None, object_store_mb: int | None = 512,
            runtime_env: dict[str, Any] | None = None) -> ClusterInfo:
    """Join `address` (`RayConfig.address_to_join`: --ray-address, the config's or $RAY_ADDRESS) with the config's
    runtime_env; without one, start Ray in this process with the dashboard off."""
    joined_here = not ray.is_initialized()
    if joined_here:
        if address:
            check_ray_address(address)
            ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
        else:
            ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, log_to_driver=False,
                     object_store_memory=object_store_mb * 1024 * 1024 if object_store_mb else None)
    resources = ray.cluster_resources()
    return ClusterInfo(address=address or "local", started_here=not address, cpus=resources.get("CPU", 0.0),
                       gpus=resources.get("GPU", 0.0), joined_here=joined_here)


def shutdown(info: ClusterInfo) -> None:
    """Leave the cluster if `connect` joined it (an in-process cluster stops with it), while its processes still
    answer: a driver whose GCS was stopped under it retries for 60 s at exit and then ends the process with exit 1."""
    if info.joined_here and ray.is_initialized():
        ray.shutdown()


def spare_cpus_per_gpu(nodes: Sequence[dict[str, Any]] | None = None) -> int:
    """CPUs a GPU actor can take without starving its node's other GPUs: the smallest CPUs/GPUs of a GPU node.

    The embedder, the NLI model's tokenizer and the host side of decoding run on these threads.
    """
    nodes = ray.nodes() if nodes is None else nodes
    shares = [int(n["Resources"].get("CPU", 1) // n["Resources"]["GPU"]) for n in nodes
              if n.get("Alive", True) and n.get("Resources", {}).get("GPU", 0) >= 1]
    return max(1, min(shares)) if shares else 1


class PlacementError(RuntimeError):
    """A model's replicas cannot be placed as its config asks; the message says what to change."""


@dataclass(frozen=True)
class Placement:
    """One replica's resource request: GPUs (0 = CPU only) and CPUs, and whether a CPU restart is allowed."""

    gpus: float
    cpus: float
    allow_cpu_fallback: bool = False
    resources: tuple[tuple[str, float], ...] = ()   # custom Ray resources (a node type that fits the model)

    @property
    def options(self) -> dict[str, Any]:
        base: dict[str, Any] = {"num_gpus": self.gpus, "num_cpus": self.cpus} if self.gpus else {"num_cpus": self.cpus}
        return {**base, "resources": dict(self.resources)} if self.resources else base

    def on_cpu(self, cpus: float | None = None) -> Placement:
        return Placement(0.0, cpus or self.cpus, allow_cpu_fallback=False)


def resolve_placement(model: str, gpus_per_replica: float | None, cluster: ClusterInfo, *, cpus_per_cpu_actor: float,
                      allow_cpu_fallback: bool = False, prefer_gpu: bool = True,
                      nodes: Sequence[dict[str, Any]] | None = None,
                      resources: dict[str, float] | None = None) -> Placement:
    """The request for one replica of `model`. `gpus_per_replica=None` means: a GPU on a cluster joined by address
    (an autoscaler may add one), and on an in-process Ray a GPU only if this machine has one. An in-process Ray
    cannot grow, so a GPU it lacks is refused at once (or dropped, when the config allows a CPU fallback)."""
    if not prefer_gpu:
        gpus = 0.0
    elif gpus_per_replica is None:
        gpus = 1.0 if (not cluster.started_here or cluster.gpus >= 1) else 0.0
    else:
        gpus = float(gpus_per_replica)
    if gpus and cluster.started_here and cluster.gpus < gpus:
        if not allow_cpu_fallback:
            raise PlacementError(
                f"model {model!r}: gpus_per_replica = {gpus:g} but the in-process Ray has {cluster.gpus:g} GPU(s); "
                "set gpus_per_replica: 0 (CPU), allow_cpu_fallback: true, or --ray-address of a cluster with GPUs")
        log.warning("model %s: no GPU in the in-process Ray; running on CPU (allow_cpu_fallback)", model)
        gpus = 0.0
    custom = tuple(sorted((resources or {}).items()))
    if not gpus:
        return Placement(0.0, max(1.0, cpus_per_cpu_actor), allow_cpu_fallback=False, resources=custom)
    share = max(1, int(spare_cpus_per_gpu(nodes) * min(gpus, 1.0))) if cluster.gpus else 1
    return Placement(gpus, float(share), allow_cpu_fallback=allow_cpu_fallback, resources=custom)


@dataclass
class WorkerPool:
    """The replicas of one model: started together, refilled when one dies, failed as a whole when it cannot run.

    `start()` creates the actors without waiting; the drain (`drain_pools`) waits for every pool's `ready()` at
    once, each bounded by `ready_timeout_s`.
    """

    name: str
    actor_cls: Any
    init_args: tuple[Any, ...]
    n_actors: int
    placement: Placement
    ready_timeout_s: float = 900.0
    max_retries: int = 2
    backoff_s: float = 2.0
    actors: list[Any] = field(default_factory=list)
    ready: list[bool] = field(default_factory=list)
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)       # the last replica's ready() answer
    placed_on: list[str] = field(default_factory=list)      # node id of each replica that became ready, in order

    def __post_init__(self) -> None:
        if self.n_actors < 1:
            raise UserError(f"n_actors = {self.n_actors!r}: need at least one worker")

    @property
    def options(self) -> dict[str, Any]:
        """The resource request the actors run with (after any allowed CPU fallback)."""
        return dict(self.placement.options)

    def _new_actor(self) -> Any:
        return self.actor_cls.options(**self.placement.options).remote(*self.init_args)

    def start(self) -> list[tuple[Any, int]]:
        """Create the actors; returns (ready ref, actor index) pairs to wait on."""
        self.actors = [self._new_actor() for _ in range(self.n_actors)]
        self.ready = [False] * self.n_actors
        return [(actor.ready.remote(), i) for i, actor in enumerate(self.actors)]

    def replace(self, index: int) -> Any:
        """A fresh actor in slot `index` (the old one is killed); returns its ready ref."""
        _kill(self.actors[index])
        self.actors[index] = self._new_actor()
        self.ready[index] = False
        return self.actors[index].ready.remote()

    def fall_back_to_cpu(self) -> list[tuple[Any, int]]:
        """Restart every replica on CPU (only when the config allows it)."""
        log.warning("model %s: no replica started on %g GPU(s) within %.0f s; restarting on CPU "
                    "(allow_cpu_fallback)", self.name, self.placement.gpus, self.ready_timeout_s)
        for actor in self.actors:
            _kill(actor)
        self.placement = self.placement.on_cpu()
        return self.start()

    def fail(self, message: str) -> None:
        self.error = self.error or message
        self.close()

    def close(self) -> None:
        """Stop the actors (the models they hold are freed)."""
        for actor in self.actors:
            _kill(actor)
        self.actors = []


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor)
    except Exception:  # already gone
        pass


@dataclass
class _Pending:
    pool: WorkerPool
    kind: str            # "ready" or "batch"
    actor: int
    batch: int = -1
    attempt: int = 0
    since: float = field(default_factory=time.monotonic)


def drain_pools(pools: Sequence[WorkerPool], jobs: dict[str, Sequence[Any]], method: str, *,
                batch_timeout_s: float = 3600.0) -> Iterator[tuple[WorkerPool, int, Any]]:
    """Start every pool, then yield (pool, batch index, result) as batches land from any of them.

    Waits are bounded: a pool none of whose replicas is ready within its `ready_timeout_s` fails (or restarts on
    CPU if allowed); a batch running longer than `batch_timeout_s`, or whose actor died, is retried on a fresh
    actor up to the pool's `max_retries`, then fails its pool; an exception raised inside a batch fails its pool.
    A failed pool's actors are stopped and its error kept in `pool.error`; the other pools go on.
    """
    drain = _Drain(pools, jobs, method, batch_timeout_s)
    while drain.pending or drain.restarts:
        landed = drain.next_landed()
        if landed is None:
            continue
        item, value = landed
        if item.kind == "batch":
            yield item.pool, item.batch, value  # stored by the caller before this actor gets its next batch
        drain.feed(item.pool, item.actor)
    for pool in pools:
        if pool.error is None:
            pool.close()


class _Drain:
    """The state of one `drain_pools`: calls in flight, each pool's queue of batches, retries and the lost
    replicas waiting out their backoff."""

    def __init__(self, pools: Sequence[WorkerPool], jobs: dict[str, Sequence[Any]], method: str,
                 batch_timeout_s: float) -> None:
        self.jobs, self.method, self.batch_timeout_s = jobs, method, batch_timeout_s
        self.pending: dict[Any, _Pending] = {}
        self.queues = {p.name: list(range(len(jobs[p.name])))[::-1] for p in pools}
        self.retries: dict[tuple[str, int], int] = {}
        self.restarts: list[tuple[float, WorkerPool, int]] = []  # (due time, pool, actor slot) of lost replicas
        for pool in pools:
            for ref, index in pool.start():
                self.pending[ref] = _Pending(pool, "ready", index)

    def next_landed(self) -> tuple[_Pending, Any] | None:
        """Wait (at most POLL_S) for the next call to finish: (its record, its value), or None when nothing
        usable landed (deadlines checked, a lost batch queued for retry, a failed pool dropped)."""
        self._restart_due()
        wait_s = min([POLL_S] + [max(0.0, due - time.monotonic()) for due, _, _ in self.restarts])
        if not self.pending:
            time.sleep(wait_s)
            return None
        done, _ = ray.wait(list(self.pending), num_returns=1, timeout=wait_s)
        if not done:
            self._check_deadlines()
            return None
        item = self.pending.pop(done[0])
        try:
            value = ray.get(done[0], timeout=60)
        except (RayActorError, GetTimeoutError) as exc:
            if item.kind == "batch":
                self._retry(item, type(exc).__name__)
            elif not any(item.pool.ready):
                self._drop(item.pool, f"its worker could not start: {_first_line(exc)}")
            return None
        except RayTaskError as exc:  # raised by the model's own code: a bug or bad input, not a lost node
            self._drop(item.pool, _first_line(exc.cause if getattr(exc, "cause", None) is not None else exc))
            return None
        if item.kind == "ready":
            item.pool.ready[item.actor] = True
            item.pool.info = value if isinstance(value, dict) else {"ready": value}
            item.pool.placed_on.append(str(item.pool.info.get("node_id", "")))
        return item, value

    def feed(self, pool: WorkerPool, actor: int) -> None:
        """Hand the free actor its pool's next batch (a lost batch first), if any is left."""
        if self.queues[pool.name]:
            batch = self.queues[pool.name].pop()
            ref = getattr(pool.actors[actor], self.method).remote(self.jobs[pool.name][batch])
            self.pending[ref] = _Pending(pool, "batch", actor, batch, self.retries.get((pool.name, batch), 0))

    def _check_deadlines(self) -> None:
        """Calls past their limit: a batch is retried; a pool with no replica ready falls back to CPU (if allowed)
        or fails; a replica that never got ready beside ready ones is stopped, the others carry on."""
        now = time.monotonic()
        for ref, item in list(self.pending.items()):
            if ref not in self.pending:
                continue
            limit = item.pool.ready_timeout_s if item.kind == "ready" else self.batch_timeout_s
            if now - item.since <= limit:
                continue
            self.pending.pop(ref)
            placement = item.pool.placement
            if item.kind == "batch":
                self._retry(item, f"no result within {self.batch_timeout_s:g} s")
            elif not any(item.pool.ready) and placement.gpus and placement.allow_cpu_fallback:
                for p_ref in [r for r, p in self.pending.items() if p.pool is item.pool]:
                    self.pending.pop(p_ref)
                for new_ref, index in item.pool.fall_back_to_cpu():
                    self.pending[new_ref] = _Pending(item.pool, "ready", index)
            elif not any(item.pool.ready):
                where = f"{placement.gpus:g} GPU(s) per replica" if placement.gpus else f"{placement.cpus:g} CPU(s)"
                self._drop(item.pool, f"no replica started within {item.pool.ready_timeout_s:g} s asking for "
                                      f"{where} (no node offers it? an autoscaler still adding one? the model still "
                                      "loading?)")
            else:
                _kill(item.pool.actors[item.actor])

    def _drop(self, pool: WorkerPool, message: str) -> None:
        log.error("model %s failed: %s", pool.name, message)
        pool.fail(message)
        for ref in [r for r, p in self.pending.items() if p.pool is pool]:
            self.pending.pop(ref)
        self.restarts[:] = [entry for entry in self.restarts if entry[1] is not pool]
        self.queues[pool.name] = []

    def _retry(self, item: _Pending, why: str) -> None:
        pool = item.pool
        if item.attempt >= pool.max_retries:
            self._drop(pool, f"batch {item.batch} failed {item.attempt + 1} times ({why})")
            return
        delay = pool.backoff_s * 2 ** item.attempt
        log.warning("model %s: worker %d lost on batch %d (%s, attempt %d); retrying in %.0f s", pool.name,
                    item.actor, item.batch, why, item.attempt + 1, delay)
        # the replacement starts after the backoff while every other pool's batches keep landing
        self.restarts.append((time.monotonic() + delay, pool, item.actor))
        self.queues[pool.name].append(item.batch)  # the lost batch goes first to the next free actor
        self.retries[(pool.name, item.batch)] = item.attempt + 1

    def _restart_due(self) -> None:
        for entry in [e for e in self.restarts if e[0] <= time.monotonic()]:
            self.restarts.remove(entry)
            _, pool, actor = entry
            self.pending[pool.replace(actor)] = _Pending(pool, "ready", actor)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:500]
