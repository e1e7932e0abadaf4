"""The Ray actor that holds one model replica and answers batches of questions (Arrow in, Arrow out).

It wraps `cic.llm.answering.Answerer`; torch uses as many threads as the actor was given CPUs (or fewer, where
OMP_NUM_THREADS says so), so two CPU actors on a two-core node do not fight over cores. It never writes DuckDB:
the flow does — from the batches it returns, or from the landing table it appended them to (`storage.landing`).
"""

from __future__ import annotations

import os
from typing import Any

import ray

from cic.llm.answering import Answerer, AnswererSettings


def _threads_for_this_actor() -> int:
    """CPUs Ray assigned to this actor (at least one), capped by OMP_NUM_THREADS where the driver's environment set
    it: Ray passes a set value through to its workers (and sets it to the actor's CPUs only where unset), so a
    thread budget the operator gave the job also holds inside its actors."""
    assigned = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    budget = os.environ.get("OMP_NUM_THREADS", "")
    return min(assigned, int(budget)) if budget.isdigit() and int(budget) > 0 else assigned


class AnswerWorker:
    """One model replica: `process(job)` generates, scores and labels a batch of questions."""

    def __init__(self, settings: AnswererSettings, load_llm: bool = True) -> None:
        import torch

        if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
            torch.set_num_threads(_threads_for_this_actor())
        self.answerer = Answerer(settings, load_llm=load_llm)

    def ready(self) -> dict[str, Any]:
        """Where this replica runs: its device, dtype and Ray node (answers once the model is loaded)."""
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {**self.answerer.ready(), "node_id": node}

    def process(self, job: dict[str, Any]) -> dict[str, Any]:
        """`job`: batch_id, run_key, criteria, prompt_id, questions (Arrow) and stored generations (Arrow or
        None), and `landing` (a Delta table's URI, or None). Returns the batch id, the three tables as Arrow (None
        when they were appended to the landing table: `landed` is its version), timing stats and the questions a
        served model gave no answer to (id -> why)."""
        import polars as pl

        questions = pl.from_arrow(job["questions"])
        stored = pl.from_arrow(job["generations"]) if job.get("generations") is not None else None
        batch = self.answerer.process(questions, run_key=job["run_key"], criteria=job["criteria"],
                                      generations=stored, prompt_id=job.get("prompt_id"))
        tables = {"generations": batch.generations.to_arrow(), "scores": batch.scores.to_arrow(),
                  "labels": batch.labels.to_arrow()}
        landed = None
        if job.get("landing"):  # appended from this node in one commit; the flow loads it from the table
            from cic.store.landing import land

            landed, tables = land(job["landing"], tables), dict.fromkeys(tables)
        return {"batch_id": job["batch_id"], "run_key": job["run_key"], **tables, "landed": landed,
                "stats": {**batch.stats, "llm_loaded": float(self.answerer.llm_loaded)}, "failures": batch.failures}


RayAnswerWorker = ray.remote(AnswerWorker)
