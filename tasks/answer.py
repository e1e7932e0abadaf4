"""Prefect task: fan a model's unfinished questions out to Ray actors and store each batch as it lands.

Workers return Arrow batches; this task (in the flow's process, the only DuckDB writer) stores a batch's
generations, scores and labels in one transaction, so a crash or kill loses at most the batches in flight
and a rerun picks up exactly what is missing (`cic.store.resume`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from prefect import task

from cic.llm.answering import AnswererSettings
from cic.pipeline import progress
from cic.store import Store
from cic.store.resume import RunWork, stored_generations
from tasks import ray_workers
from tasks.answer_worker import RayAnswerWorker

log = logging.getLogger("cic.pipeline")
#: How long a batch write waits for another process to release the store before the task fails.
WRITE_WAIT_S = 300.0


@dataclass(frozen=True)
class RunJob:
    """One (model, dataset) run: its key, its questions, what is missing and how to label it."""

    run_key: str
    dataset: str
    prompt_id: str
    criteria: tuple[str, ...]
    questions: pl.DataFrame
    work: RunWork


@dataclass
class AnswerStats:
    """What the answering stage did for one model."""

    model: str
    questions: int = 0
    generated: int = 0
    batches: int = 0
    actors: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    load_s: float = 0.0

    @property
    def questions_per_s(self) -> float:
        busy = self.wall_s - self.load_s
        return self.generated / busy if busy > 0 and self.generated else 0.0


def make_jobs(store: Store, runs: list[RunJob], questions_per_batch: int) -> list[dict[str, Any]]:
    """Shard every run's unfinished questions into batches for the workers."""
    jobs = []
    for run in runs:
        for ids, generate in ((run.work.to_generate, True), (run.work.to_score, False)):
            for start in range(0, len(ids), questions_per_batch):
                chunk = ids[start:start + questions_per_batch]
                batch = run.questions.filter(pl.col("question_id").is_in(chunk))
                stored = None if generate else stored_generations(store, run.run_key, chunk).to_arrow()
                jobs.append({"batch_id": len(jobs), "run_key": run.run_key, "criteria": list(run.criteria),
                             "prompt_id": run.prompt_id, "questions": batch.to_arrow(), "generations": stored})
    return jobs


def store_batch(store: Store, result: dict[str, Any]) -> None:
    """Write one worker batch atomically: all three tables or nothing."""
    with store.transaction():
        store.upsert("generations", result["generations"])
        store.upsert("scores", result["scores"])
        store.upsert("labels", result["labels"])


@task(name="answer", retries=1, retry_delay_seconds=10)
def answer_questions(db: str, model: str, settings: AnswererSettings, runs: list[RunJob], *, replicas: int = 1,
                     questions_per_batch: int = 8, ray_address: str | None = None, prefer_gpu: bool = True,
                     num_cpus: int | None = None, ready_timeout_s: float = 900.0) -> AnswerStats:
    """Generate → score → label every unfinished question of `runs` with `replicas` actors of `model`."""
    stats = AnswerStats(model=model)
    started = time.perf_counter()
    with Store.open(db) as store:
        jobs = make_jobs(store, runs, questions_per_batch)
    stats.questions = sum(j["questions"].num_rows for j in jobs)
    if not jobs:
        progress.report(f"answer {model}", 0, 0)
        return stats
    cluster = ray_workers.connect(ray_address, num_cpus=num_cpus)
    n_actors = max(1, min(replicas, len(jobs)))
    pool = ray_workers.WorkerPool(RayAnswerWorker, (settings,), n_actors=n_actors, cluster_gpus=cluster.gpus,
                                  prefer_gpu=prefer_gpu, ready_timeout_s=ready_timeout_s,
                                  cpus_per_actor=max(1.0, float(cluster.cpus // n_actors)))
    stats.actors, stats.options = n_actors, pool.options
    stats.load_s = time.perf_counter() - started
    done = 0
    try:
        for _, result in pool.map("process", jobs):
            # the file is held only while one batch is written: readers (cic ask, a calibration, the nightly
            # recalibration) get it between batches, and a reader holding it makes this wait, not fail
            with Store.open(db, wait_s=WRITE_WAIT_S) as store:
                store_batch(store, result)
            done += int(result["stats"]["questions"])
            stats.generated += int(result["stats"]["generated_questions"])
            stats.batches += 1
            progress.report(f"answer {model}", done, stats.questions)
    finally:
        pool.close()
    stats.wall_s = time.perf_counter() - started
    log.info("%s: %d questions (%d generated) in %d batches on %d actor(s), %.1f s", model, stats.questions,
             stats.generated, stats.batches, n_actors, stats.wall_s)
    return stats
