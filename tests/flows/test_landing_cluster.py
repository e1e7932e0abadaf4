"""The answer stage with a landing table on a three-node Ray cluster built on this machine (separate raylet
processes, the landing table on a shared local path): workers append their batches to the Delta table from their
nodes, one worker is killed with SIGKILL mid-run, and the store ends with exactly what a run without a landing
table stores — one row per key — while a rerun and a second load add nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from cic.pipeline.run import progress
from cic.store import Store
from cic.store.landing import load_landing
from flows.pipeline import pipeline
from tests.flows.test_pipeline_e2e import MODEL

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.faults]
KEYS = {"generations": ["run_key", "question_id", "sample_index"], "scores": ["run_key", "question_id", "estimator"],
        "labels": ["run_key", "question_id", "criterion"]}


def _config(tmp: Path, landing: Path | None, db: Path) -> Path:
    path = tmp / f"{db.stem}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "landing", "datasets": [{"name": "trivia_qa", "limit": 6}],
        "models": [{"name": "smollm2", "spec": MODEL, "gpus_per_replica": 0, "replicas": 2}],
        "generation": {"n_samples": 2, "max_new_tokens": 8, "seed": 0, "questions_per_batch": 1},
        "uncertainty": {"estimators": ["predictive_entropy", "lexical_similarity"]},
        "calibration": {"alphas": [0.5], "bounds": ["cp"], "n_splits": 5},
        "ray": {"ready_timeout_s": 300, "batch_timeout_s": 300},
        "storage": {"db": str(db), "report_dir": str(tmp / "reports"), "model_cache": os.environ["CIC_CACHE_DIR"],
                    **({"landing": str(landing)} if landing else {})}}))
    return path


def _worker_pids() -> list[int]:
    from ray._private import state

    return [int(a["Pid"]) for a in state.actors().values()
            if a["ActorClassName"].endswith("AnswerWorker") and a["State"] == "ALIVE"]


def _tables(db: Path) -> dict[str, pl.DataFrame]:
    with Store.open(db, read_only=True) as store:
        return {name: store.read(name) for name in KEYS}


def test_workers_land_from_their_nodes_a_killed_worker_loses_nothing_and_loads_are_exactly_once(
        tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the head runs no actor
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    landing, db = tmp_path / "shared" / "landing", tmp_path / "landed.duckdb"
    landing.parent.mkdir()
    killed: list[int] = []

    def kill_one(stage: str, done: int, total: int) -> None:
        if stage.startswith("answer ") and done >= 2 and not killed:
            pid = _worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    unsubscribe = progress.subscribe(kill_one)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        summary = pipeline(config_path=str(_config(tmp_path, landing, db)), ray_address=cluster.address,
                           log_to_mlflow=False)
        again = pipeline(config_path=str(_config(tmp_path, landing, db)), ray_address=cluster.address,
                         log_to_mlflow=False)
    finally:
        unsubscribe()
        ray.shutdown()
        cluster.shutdown()
    answer = summary.answer[0]
    assert killed and answer.error is None and answer.questions == 6, answer
    assert set(answer.nodes) <= {n.node_id for n in nodes} and len(set(answer.nodes)) == 2  # both worker nodes
    assert again.answer[0].questions == 0  # the rerun finds every answer loaded: nothing generated again
    tables = _tables(db)
    for name, key in KEYS.items():  # one row per key, every question of the run present
        frame = tables[name]
        assert frame.height == frame.unique(subset=key).height and frame.height > 0, name
        assert frame.get_column("question_id").n_unique() == 6, name
    with Store.open(db) as store:  # a second load adds nothing
        before = store.counts()
        extra = load_landing(store, landing)
        assert extra.files == 0 and store.counts() == before
        loaded = store.sql("SELECT count(*), sum(rows) FROM lake_files")[0]
    assert loaded[0] >= 6 and loaded[1] >= sum(f.height for f in tables.values())


def test_without_a_landing_table_the_same_run_stores_the_same_keys(tmp_path: Path) -> None:
    """The landing table changes where batches travel, not what is stored."""
    from ray.cluster_utils import Cluster

    tables: dict[str, dict[str, pl.DataFrame]] = {}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        for name, landing in (("direct", None), ("landed", tmp_path / "landing")):
            db = tmp_path / f"{name}.duckdb"
            pipeline(config_path=str(_config(tmp_path, landing, db)), ray_address=cluster.address,
                     log_to_mlflow=False)
            tables[name] = _tables(db)
    finally:
        ray.shutdown()
        cluster.shutdown()
    for name, key in KEYS.items():
        direct, landed = (tables[k][name].select(key).sort(key) for k in ("direct", "landed"))
        assert direct.equals(landed), name
    scores: dict[str, Any] = {k: tables[k]["scores"].sort(KEYS["scores"]).get_column("value") for k in tables}
    assert scores["direct"].equals(scores["landed"])  # seeded: the same generations, the same scores
