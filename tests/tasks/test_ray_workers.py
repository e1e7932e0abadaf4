"""Ray plumbing on a real in-process cluster: CPU placement, GPU fallback, fan-out and worker-loss retries."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tasks import ray_workers  # noqa: E402

pytestmark = pytest.mark.slow


@ray.remote
class Doubler:
    """A stand-in worker with the pool's protocol (ready + a batch method); real workers hold a model."""

    def __init__(self, crash_marker: str | None = None) -> None:
        self.crash_marker = crash_marker

    def ready(self) -> bool:
        return True

    def run(self, batch: list[int]) -> list[int]:
        if self.crash_marker and 13 in batch and not Path(self.crash_marker).exists():
            Path(self.crash_marker).write_text("crashed once")
            os._exit(1)  # the worker process dies, as on a lost node
        return [2 * x for x in batch]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ray_workers.ClusterInfo]:
    info = ray_workers.connect(num_cpus=2)
    yield info
    ray_workers.shutdown(info)


def test_in_process_cluster_has_no_gpu_and_asks_for_cpus(cluster: ray_workers.ClusterInfo) -> None:
    assert cluster.started_here and cluster.gpus == 0 and cluster.cpus == 2
    assert ray_workers.actor_options(cluster.gpus) == {"num_cpus": 1.0}
    assert ray_workers.actor_options(2.0) == {"num_gpus": 1, "num_cpus": 1}
    assert ray_workers.actor_options(2.0, cpus_per_gpu=8) == {"num_gpus": 1, "num_cpus": 8}


def test_gpu_actors_take_the_cpus_their_node_can_spare() -> None:
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0}},                  # a CPU-only head: not counted
             {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 4.0}},       # 8 per GPU
             {"Alive": True, "Resources": {"CPU": 12.0, "GPU": 2.0}},       # 6 per GPU: the binding node
             {"Alive": False, "Resources": {"CPU": 2.0, "GPU": 2.0}}]       # dead
    assert ray_workers.spare_cpus_per_gpu(nodes) == 6
    assert ray_workers.spare_cpus_per_gpu(nodes[:1]) == 1


def test_gpu_request_on_a_gpu_less_cluster_falls_back_and_finishes(cluster: ray_workers.ClusterInfo) -> None:
    actor, options = ray_workers.place_actor(Doubler, options={"num_gpus": 1, "num_cpus": 1}, ready_timeout_s=3)
    assert options == {"num_cpus": 1}
    assert ray.get(actor.run.remote([1, 2])) == [2, 4]
    ray.kill(actor)


def test_pool_maps_every_batch_once(cluster: ray_workers.ClusterInfo) -> None:
    pool = ray_workers.WorkerPool(Doubler, (), n_actors=2, cluster_gpus=cluster.gpus)
    batches = [[i, i + 100] for i in range(7)]
    seen = dict(pool.map("run", batches))
    pool.close()
    assert seen == {i: [2 * i, 2 * (i + 100)] for i in range(7)}


def test_pool_retries_a_batch_whose_worker_died(cluster: ray_workers.ClusterInfo, tmp_path: Path) -> None:
    marker = tmp_path / "crash"
    pool = ray_workers.WorkerPool(Doubler, (str(marker),), n_actors=1, cluster_gpus=0, backoff_s=0.1)
    seen = dict(pool.map("run", [[1], [13], [5]]))
    pool.close()
    assert marker.exists() and seen == {0: [2], 1: [26], 2: [10]}


def test_pool_needs_an_actor() -> None:
    with pytest.raises(ValueError, match="n_actors = 0"):
        ray_workers.WorkerPool(Doubler, (), n_actors=0, cluster_gpus=0)
