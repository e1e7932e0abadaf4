"""The answer actor's torch threads on a real in-process Ray: the CPUs Ray gave the actor, never more than the
OMP_NUM_THREADS budget its environment sets, and a budget that is no positive count is ignored (two actors each
spinning threads for every core run several times slower on a shared machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from cic.services import ray_pool  # noqa: E402
from cic.services.answer_worker import _threads_for_this_actor  # noqa: E402

pytestmark = pytest.mark.slow


@ray.remote
class ThreadProbe:
    def threads(self) -> int:
        return _threads_for_this_actor()


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    info = ray_pool.connect(num_cpus=2)
    yield
    ray_pool.shutdown(info)


@pytest.mark.parametrize(("cpus", "budget", "threads"),
                         [(2, "1", 1), (1, "4", 1), (2, "8", 2), (2, "none", 2), (2, "0", 2)])
def test_an_actor_uses_its_cpus_capped_by_the_thread_budget(cluster: None, cpus: int, budget: str,
                                                            threads: int) -> None:
    probe = ThreadProbe.options(num_cpus=cpus, runtime_env={"env_vars": {"OMP_NUM_THREADS": budget}}).remote()
    try:
        assert ray.get(probe.threads.remote(), timeout=120) == threads
    finally:
        ray.kill(probe)
