"""The pipeline on a multi-node Ray cluster built on this machine (`ray.cluster_utils.Cluster`, every node local):
a head that takes no model work and two worker nodes that declare one GPU each as a logical resource. Two models
with half a GPU per replica answer at once on the GPU nodes; removing the node under one of them mid-run has its
batches retried on the other node, and the store ends with exactly one row per key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from cic.pipeline.run import progress
from cic.store import Store
from flows.pipeline import pipeline
from tests.flows.test_pipeline_e2e import ESTIMATORS, MODEL, K

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.faults]


def _config(tmp: Path) -> Path:
    cache = os.environ["CIC_CACHE_DIR"]  # the session's (tests/conftest.py)
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump({
        "name": "cluster", "datasets": [{"name": "trivia_qa", "limit": 6}],
        "models": [{"name": name, "spec": MODEL, "gpus_per_replica": 0.5} for name in ("alpha", "beta")],
        "generation": {"n_samples": K, "max_new_tokens": 12, "seed": 0, "questions_per_batch": 2},
        "uncertainty": {"estimators": ESTIMATORS}, "calibration": {"alphas": [0.5], "bounds": ["cp"], "n_splits": 5},
        "ray": {"ready_timeout_s": 300, "batch_timeout_s": 300},
        "storage": {"db": str(tmp / "cic.duckdb"), "report_dir": str(tmp / "reports"), "model_cache": cache}}))
    return path


def _nodes_of_live_workers() -> list[str]:
    """The node of every answer worker alive now (one per model replica), from Ray's actor table."""
    from ray._private import state

    return [actor["Address"]["NodeID"] for actor in state.actors().values()
            if actor["ActorClassName"].endswith("AnswerWorker") and actor["State"] == "ALIVE"]


def test_two_models_on_gpu_nodes_at_once_and_a_lost_node_is_retried_elsewhere(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the head runs no actor
    gpu_nodes = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    live: list[list[str]] = []   # the nodes of the live answer workers each time a batch landed
    removed: list[str] = []

    def watch(stage: str, done: int, total: int) -> None:
        if not stage.startswith("answer ") or done == 0:
            return
        live.append(_nodes_of_live_workers())
        if stage == "answer alpha" and done >= 2 and not removed:
            node = next(n for n in gpu_nodes if n.node_id == live[-1][0])
            cluster.remove_node(node)
            removed.append(node.node_id)

    unsubscribe = progress.subscribe(watch)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        summary = pipeline(config_path=str(_config(tmp_path)), ray_address=cluster.address, log_to_mlflow=False)
    finally:
        unsubscribe()
        ray.shutdown()
        cluster.shutdown()
    answer = {a.model: a for a in summary.answer}
    assert removed and all(a.error is None for a in answer.values()), answer
    gpu_ids = {n.node_id for n in gpu_nodes}
    for stats in answer.values():  # GPU replicas run on the GPU nodes only, asked for as half a GPU
        assert stats.options == {"num_gpus": 0.5, "num_cpus": 1.0}
        assert set(stats.nodes) <= gpu_ids and stats.questions == 6
    assert any(len(set(a.nodes)) == 2 for a in answer.values())  # a replacement started on the other node
    # at once: as batches landed, both models' half-GPU replicas were alive on the GPU nodes together (the order
    # their batches land in depends on which model the removed node held and how long its replacement loads)
    assert any(len(nodes) == 2 and set(nodes) <= gpu_ids for nodes in live), live
    with Store.open(summary.db, read_only=True) as store:
        generations = store.read("generations")
        scores = store.read("scores")
    assert generations.height == 2 * 6 * (1 + K)
    assert generations.select("run_key", "question_id", "sample_index").n_unique() == generations.height
    assert scores.group_by("run_key", "question_id", "estimator").len()["len"].unique().to_list() == [1]


def test_a_model_that_fails_is_named_and_the_other_finishes(tmp_path: Path) -> None:
    """An unloadable model: the run ends Failed naming it; the other model's results are stored and calibrated."""
    config = _config(tmp_path)
    spec: dict[str, Any] = yaml.safe_load(config.read_text())
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # a file that passes the preflight but does not load
    spec["models"] = [{"name": "good", "spec": MODEL, "gpus_per_replica": 0},
                      {"name": "broken", "spec": str(broken), "gpus_per_replica": 0}]
    config.write_text(yaml.safe_dump(spec))
    from cic.services import ray_pool

    info = ray_pool.connect(num_cpus=2)
    try:
        state = pipeline(config_path=str(config), log_to_mlflow=False, return_state=True)
    finally:
        ray_pool.shutdown(info)
    assert state.is_failed() and "broken" in state.message and "good" not in state.message.split("failed:")[1]
    summary = state.result(raise_on_failure=False).summary
    answer = {a.model: a for a in summary.answer}
    assert answer["good"].error is None and answer["good"].generated == 6
    assert "could not be read" in answer["broken"].error or "GGUF" in answer["broken"].error
    with Store.open(summary.db, read_only=True) as store:
        runs = store.read("runs")
        good = runs.filter(model="good")["run_key"][0]
        assert store.count("generations", run_key=good) == 6 * (1 + K)
        assert set(store.read("calibrations")["model"]) == {"good"}  # the failed model's partial run is not
