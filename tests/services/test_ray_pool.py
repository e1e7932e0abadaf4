"""Ray plumbing on a real in-process cluster: placement from the config, every pool drained at once, bounded waits,
worker-loss retries, and a failing model that does not stop the others."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cic.errors import UserError  # noqa: E402
from cic.services import ray_pool  # noqa: E402
from cic.services.ray_pool import ClusterInfo, Placement, PlacementError, WorkerPool  # noqa: E402

pytestmark = pytest.mark.slow
CPU = Placement(0.0, 1.0)


@ray.remote
class Doubler:
    """A stand-in worker with the pool's protocol (ready + a batch method); real workers hold a model."""

    def __init__(self, crash_marker: str | None = None, broken: bool = False, slow_on: int | None = None,
                 pause_s: float = 0.0, go_marker: str | None = None) -> None:
        if broken:
            raise ValueError("this model does not fit")
        self.crash_marker, self.slow_on = crash_marker, slow_on  # the marker also records a hang, once
        self.pause_s = pause_s  # seconds each batch takes, as a model's would
        self.go_marker = go_marker  # the crash waits for this file: the test decides when the worker is lost

    def ready(self) -> bool:
        return True

    def run(self, batch: list[int]) -> list[int]:
        if 666 in batch:
            os._exit(1)  # a batch that kills its worker every time (a poison input, an OOM)
        if self.crash_marker and 13 in batch and not Path(self.crash_marker).exists():
            deadline = time.monotonic() + 120
            while self.go_marker and not Path(self.go_marker).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            Path(self.crash_marker).write_text("crashed once")
            os._exit(1)  # the worker process dies, as on a lost node
        if self.slow_on is not None and self.slow_on in batch and not Path(self.crash_marker).exists():
            Path(self.crash_marker).write_text("hung once")
            time.sleep(600)  # a hung batch: the drain's deadline takes it back
        if -1 in batch:
            raise RuntimeError("bad input in batch")
        time.sleep(self.pause_s)
        return [2 * x for x in batch]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    info = ray_pool.connect(num_cpus=2)
    yield info
    ray_pool.shutdown(info)


def _drain(pools: list[WorkerPool], jobs: dict[str, list], **kwargs: float) -> dict[str, dict[int, list[int]]]:
    seen: dict[str, dict[int, list[int]]] = {p.name: {} for p in pools}
    for pool, index, result in ray_pool.drain_pools(pools, jobs, "run", **kwargs):
        assert index not in seen[pool.name]
        seen[pool.name][index] = result
    return seen


def test_placement_comes_from_the_config_not_from_what_the_cluster_has_now() -> None:
    local = ClusterInfo("local", True, cpus=8, gpus=0)
    remote = ClusterInfo("ray://head:10001", False, cpus=4, gpus=0)  # GPU workers: 0 now, autoscaled later
    gpu_nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}}]
    assert ray_pool.resolve_placement("m", None, local, cpus_per_cpu_actor=4).options == {"num_cpus": 4}
    assert ray_pool.resolve_placement("m", None, remote, cpus_per_cpu_actor=4).options == {"num_gpus": 1.0,
                                                                                              "num_cpus": 1.0}
    packed = ray_pool.resolve_placement("m", 0.5, ClusterInfo("a", False, 16, 2), cpus_per_cpu_actor=1,
                                           nodes=gpu_nodes)
    assert packed.options == {"num_gpus": 0.5, "num_cpus": 4.0}  # half a GPU, half its node's spare CPUs
    assert ray_pool.resolve_placement("m", 0, remote, cpus_per_cpu_actor=2).options == {"num_cpus": 2}
    with pytest.raises(PlacementError, match="gpus_per_replica = 1 but the in-process Ray has 0 GPU"):
        ray_pool.resolve_placement("m", 1, local, cpus_per_cpu_actor=1)
    fallback = ray_pool.resolve_placement("m", 1, local, cpus_per_cpu_actor=2, allow_cpu_fallback=True)
    assert fallback.options == {"num_cpus": 2}
    assert ray_pool.resolve_placement("m", 1, remote, cpus_per_cpu_actor=2, prefer_gpu=False).gpus == 0


def test_gpu_actors_take_the_cpus_their_node_can_spare() -> None:
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0}},                  # a CPU-only head: not counted
             {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 4.0}},       # 8 per GPU
             {"Alive": True, "Resources": {"CPU": 12.0, "GPU": 2.0}},       # 6 per GPU: the binding node
             {"Alive": False, "Resources": {"CPU": 2.0, "GPU": 2.0}}]       # dead
    assert ray_pool.spare_cpus_per_gpu(nodes) == 6
    assert ray_pool.spare_cpus_per_gpu(nodes[:1]) == 1


def test_two_pools_drain_together_every_batch_once(cluster: ClusterInfo) -> None:
    pools = [WorkerPool("a", Doubler, (), n_actors=1, placement=CPU), WorkerPool("b", Doubler, (), n_actors=1,
                                                                                   placement=CPU)]
    jobs = {"a": [[i] for i in range(5)], "b": [[100 + i] for i in range(4)]}
    seen = _drain(pools, jobs)
    assert seen == {"a": {i: [2 * i] for i in range(5)}, "b": {i: [200 + 2 * i] for i in range(4)}}
    assert all(p.error is None and p.actors == [] for p in pools)


def test_a_batch_whose_worker_died_is_retried(cluster: ClusterInfo, tmp_path: Path) -> None:
    pool = WorkerPool("a", Doubler, (str(tmp_path / "crash"),), n_actors=1, placement=CPU, backoff_s=0.1)
    seen = _drain([pool], {"a": [[1], [13], [5]]})
    assert (tmp_path / "crash").exists() and seen["a"] == {0: [2], 1: [26], 2: [10]} and pool.error is None


def test_a_lost_worker_waits_out_its_backoff_while_the_other_models_batches_keep_landing(
        cluster: ClusterInfo, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The backoff before a replacement starts must not stall the drain: another model's batches land meanwhile.

    The worker is lost only once the other model has landed a batch (its actor is up, however slowly Ray started it),
    so what lands during the backoff measures the drain, not the machine's load."""
    go = tmp_path / "go"
    lost = WorkerPool("lost", Doubler, (str(tmp_path / "crash"), False, None, 0.0, str(go)), n_actors=1,
                      placement=CPU, backoff_s=6)
    busy = WorkerPool("busy", Doubler, (None, False, None, 0.25), n_actors=1, placement=CPU)
    landed: dict[str, list[float]] = {"lost": [], "busy": []}
    with caplog.at_level(logging.WARNING, logger="cic.ray"):
        for pool, _, _ in ray_pool.drain_pools([lost, busy], {"lost": [[13], [5]],
                                                              "busy": [[i] for i in range(24)]}, "run"):
            landed[pool.name].append(time.time())
            go.touch()
    assert (tmp_path / "crash").exists() and lost.error is None and len(landed["lost"]) == 2
    lost_at = next(r.created for r in caplog.records if "model lost: worker 0 lost on batch 0" in r.getMessage())
    during_backoff = [t for t in landed["busy"] if lost_at < t < lost_at + 5.5]
    assert landed["busy"][0] < lost_at, (lost_at, landed)
    assert len(landed["busy"]) == 24 and during_backoff, (lost_at, landed)


def test_a_batch_that_kills_every_worker_fails_its_model_after_its_retries_and_the_other_finishes(
        cluster: ClusterInfo) -> None:
    poison = WorkerPool("poison", Doubler, (), n_actors=1, placement=CPU, backoff_s=0.1, max_retries=2)
    fine = WorkerPool("fine", Doubler, (), n_actors=1, placement=CPU)
    started = time.monotonic()
    seen = _drain([poison, fine], {"poison": [[1], [666], [3]], "fine": [[i] for i in range(4)]})
    assert "batch 1 failed 3 times (ActorDiedError)" in poison.error and 1 not in seen["poison"]
    assert seen["fine"] == {i: [2 * i] for i in range(4)} and fine.error is None and poison.actors == []
    assert time.monotonic() - started < 60


def test_a_failing_model_is_reported_and_the_other_finishes(cluster: ClusterInfo) -> None:
    broken = WorkerPool("broken", Doubler, (None, True), n_actors=1, placement=CPU)
    bad_batch = WorkerPool("bad-batch", Doubler, (), n_actors=1, placement=CPU)
    fine = WorkerPool("fine", Doubler, (), n_actors=1, placement=CPU)
    seen = _drain([broken, bad_batch, fine], {"broken": [[1]], "bad-batch": [[1], [-1], [3]],
                                              "fine": [[i] for i in range(4)]})
    assert seen["fine"] == {i: [2 * i] for i in range(4)} and fine.error is None
    assert seen["broken"] == {} and "this model does not fit" in broken.error
    assert "bad input in batch" in bad_batch.error and 1 not in seen["bad-batch"]


def test_a_gpu_request_nothing_can_meet_fails_its_model_in_bounded_time_or_falls_back_when_allowed(
        cluster: ClusterInfo) -> None:
    started = time.monotonic()
    stuck = WorkerPool("stuck", Doubler, (), n_actors=1, placement=Placement(1.0, 1.0), ready_timeout_s=3)
    # its CPU replica gets the same limit to start: 20 s, as a busy two-core CI machine running three test workers
    # may need for a fresh Ray worker process (3 s and 8 s each failed once there)
    fallback = WorkerPool("fallback", Doubler, (), n_actors=1, placement=Placement(1.0, 1.0, allow_cpu_fallback=True),
                          ready_timeout_s=20)
    seen = _drain([stuck, fallback], {"stuck": [[1]], "fallback": [[2]]})
    assert time.monotonic() - started < 60
    assert "no replica started within 3 s asking for 1 GPU(s) per replica" in stuck.error
    assert seen == {"stuck": {}, "fallback": {0: [4]}} and fallback.options == {"num_cpus": 1.0}


def test_a_hung_batch_is_taken_back_after_the_batch_timeout(cluster: ClusterInfo, tmp_path: Path) -> None:
    pool = WorkerPool("slow", Doubler, (str(tmp_path / "hung"), False, 7), n_actors=1, placement=CPU, backoff_s=0.1)
    started = time.monotonic()
    seen = _drain([pool], {"slow": [[1], [7], [3]]}, batch_timeout_s=4)
    assert seen["slow"] == {0: [2], 1: [14], 2: [6]} and pool.error is None
    assert time.monotonic() - started < 60


def test_pool_needs_an_actor() -> None:
    with pytest.raises(UserError, match="n_actors = 0"):
        WorkerPool("a", Doubler, (), n_actors=0, placement=CPU)
