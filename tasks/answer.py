"""Prefect task: fan every model's unfinished questions out to its Ray actors at once; store batches as they land
(the work is `cic.services.answer_stage`'s)."""

from __future__ import annotations

from prefect import task

from cic.pipeline.run.run_results import AnswerStats
from cic.services.answer_stage import ModelJob, answer_all
from cic.services.prefect_runs import run_logger

__all__ = ["answer_questions"]


def answer_run_name() -> str:
    """The answer task run's name in the Prefect UI: the models it answers with."""
    from prefect.runtime import task_run

    models = (task_run.parameters or {}).get("models") or []
    return "answer · " + (", ".join(getattr(m, "model", str(m)) for m in models) or "no model")


@task(name="answer", task_run_name=answer_run_name, timeout_seconds=7 * 24 * 3600)
def answer_questions(db: str, models: list[ModelJob], *, questions_per_batch: int = 8,
                     ready_timeout_s: float = 900.0, batch_timeout_s: float = 3600.0,
                     landing: str | None = None) -> list[AnswerStats]:
    """Generate → score → label every unfinished question of every model at once: one pool of replicas per model,
    batches stored as they land from any pool. A model that fails is reported in its stats (`error`); the
    others finish. With `landing` (a Delta table) workers append there and the flow loads it. Call inside
    `ray_pool.connect` (the flow does)."""
    return answer_all(db, models, questions_per_batch=questions_per_batch, ready_timeout_s=ready_timeout_s,
                      batch_timeout_s=batch_timeout_s, logger=run_logger(), landing=landing)
