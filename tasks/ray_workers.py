"""Ray plumbing: join or start a cluster, place one worker actor per model replica, fan batches out to them.

Actors ask for a GPU only when the cluster has one: a `num_gpus=1` request on a GPU-less cluster would wait
forever, so placement checks the cluster's resources and, should a GPU actor still not come up within a
timeout (e.g. the GPU node is gone), kills it and falls back to a CPU actor. Workers return data (polars
frames); they never touch DuckDB.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from cic.pipeline.preflight import check_ray_address

log = logging.getLogger("cic.ray")


@dataclass(frozen=True)
class ClusterInfo:
    """What the driver joined: the address ("local" for an in-process cluster) and its resources."""

    address: str
    started_here: bool
    cpus: float
    gpus: float


def connect(address: str | None = None, *, num_cpus: int | None = None,
            object_store_mb: int | None = 512) -> ClusterInfo:
    """Join `address` (or $RAY_ADDRESS); without one, start Ray in this process with the dashboard off."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not ray.is_initialized():
        if address:
            check_ray_address(address)
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, log_to_driver=False,
                     object_store_memory=object_store_mb * 1024 * 1024 if object_store_mb else None)
    resources = ray.cluster_resources()
    return ClusterInfo(address=address or "local", started_here=not address, cpus=resources.get("CPU", 0.0),
                       gpus=resources.get("GPU", 0.0))


def shutdown(info: ClusterInfo) -> None:
    """Leave the cluster; an in-process cluster stops with it."""
    if ray.is_initialized():
        ray.shutdown()


def spare_cpus_per_gpu(nodes: Sequence[dict[str, Any]] | None = None) -> int:
    """CPUs a GPU actor can take without starving its node's other GPUs: the smallest CPUs/GPUs of a GPU node.

    The embedder, the NLI model's tokenizer and the host side of decoding run on these threads.
    """
    nodes = ray.nodes() if nodes is None else nodes
    shares = [int(n["Resources"].get("CPU", 1) // n["Resources"]["GPU"]) for n in nodes
              if n.get("Alive", True) and n.get("Resources", {}).get("GPU", 0) >= 1]
    return max(1, min(shares)) if shares else 1


def actor_options(cluster_gpus: float, *, prefer_gpu: bool = True, cpus_per_actor: float = 1.0,
                  cpus_per_gpu: int = 1) -> dict[str, Any]:
    """Resource request for one model replica: a whole GPU (and its node's spare CPUs) when the cluster has
    one, else CPUs."""
    if prefer_gpu and cluster_gpus >= 1:
        return {"num_gpus": 1, "num_cpus": cpus_per_gpu}
    return {"num_cpus": cpus_per_actor}


def place_actor(actor_cls: Any, *args: Any, options: dict[str, Any], ready_timeout_s: float = 600.0,
                **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """Create an actor and wait until its `ready()` answers; a GPU actor that never starts falls back to CPU.

    Returns the actor handle and the options it actually runs with. Model loading happens in the actor's
    constructor, so `ready_timeout_s` must cover it.
    """
    actor = actor_cls.options(**options).remote(*args, **kwargs)
    try:
        ray.get(actor.ready.remote(), timeout=ready_timeout_s)
        return actor, options
    except GetTimeoutError:
        if not options.get("num_gpus"):
            ray.kill(actor)
            raise TimeoutError(f"worker actor did not start within {ready_timeout_s} s on CPU") from None
        log.warning("a GPU worker did not start within %.0f s (no free GPU?); falling back to CPU",
                    ready_timeout_s)
        ray.kill(actor)
    cpu_options = {"num_cpus": options.get("num_cpus", 1)}
    actor = actor_cls.options(**cpu_options).remote(*args, **kwargs)
    ray.get(actor.ready.remote())
    return actor, cpu_options


class WorkerPool:
    """A fixed set of actors of one class; `map` sends each batch to a free actor and yields results as they land.

    A batch whose actor dies (node lost, OOM kill) is retried on a fresh actor up to `max_retries` times with
    exponential backoff; other failures propagate.
    """

    def __init__(self, actor_cls: Any, init_args: Sequence[Any], *, n_actors: int, cluster_gpus: float,
                 prefer_gpu: bool = True, ready_timeout_s: float = 600.0, max_retries: int = 2,
                 backoff_s: float = 2.0, cpus_per_actor: float = 1.0) -> None:
        if n_actors < 1:
            raise ValueError(f"n_actors = {n_actors!r}: need at least one worker")
        self._cls, self._args = actor_cls, tuple(init_args)
        self._max_retries, self._backoff_s, self._timeout = max_retries, backoff_s, ready_timeout_s
        self._options = actor_options(cluster_gpus, prefer_gpu=prefer_gpu, cpus_per_actor=cpus_per_actor,
                                      cpus_per_gpu=spare_cpus_per_gpu() if cluster_gpus >= 1 else 1)
        self.actors: list[Any] = []
        for _ in range(n_actors):
            actor, self._options = place_actor(actor_cls, *self._args, options=self._options,
                                               ready_timeout_s=ready_timeout_s)
            self.actors.append(actor)

    @property
    def options(self) -> dict[str, Any]:
        """The resource request the actors run with (after any GPU fallback)."""
        return dict(self._options)

    def _replace(self, index: int) -> None:
        try:
            ray.kill(self.actors[index])
        except Exception:  # the actor is already gone
            pass
        self.actors[index], self._options = place_actor(self._cls, *self._args, options=self._options,
                                                        ready_timeout_s=self._timeout)

    def map(self, method: str, batches: Sequence[Any],
            on_result: Callable[[int, Any], None] | None = None) -> Iterator[tuple[int, Any]]:
        """Run `actor.<method>(batch)` for every batch across the actors; yield (batch index, result)."""
        pending: dict[Any, tuple[int, int, int]] = {}  # ref -> (batch index, actor index, attempt)
        queue = list(range(len(batches)))[::-1]
        free = list(range(len(self.actors)))

        def submit(batch_index: int, actor_index: int, attempt: int) -> None:
            ref = getattr(self.actors[actor_index], method).remote(batches[batch_index])
            pending[ref] = (batch_index, actor_index, attempt)

        while queue and free:
            submit(queue.pop(), free.pop(), 0)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            batch_index, actor_index, attempt = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except RayActorError:
                if attempt >= self._max_retries:
                    raise
                delay = self._backoff_s * 2 ** attempt
                log.warning("worker %d lost on batch %d (attempt %d); retrying in %.0f s", actor_index,
                            batch_index, attempt + 1, delay)
                time.sleep(delay)
                self._replace(actor_index)
                submit(batch_index, actor_index, attempt + 1)
                continue
            if on_result is not None:
                on_result(batch_index, result)
            yield batch_index, result
            if queue:
                submit(queue.pop(), actor_index, 0)

    def close(self) -> None:
        """Stop the actors (the models they hold are freed)."""
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:
                pass
        self.actors = []
