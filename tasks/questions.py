"""Prefect task: load a dataset's questions (bundled sample, hub or local file) and store them."""

from __future__ import annotations

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from cic.data import load_questions
from cic.pipeline.config import DatasetConfig
from cic.store import Store


def source_argument(source: str) -> str | None:
    """The config's `source` as `load_questions` takes it ("bundled" = the packaged sample)."""
    return None if source == "bundled" else source


@task(name="load-questions", task_run_name="load-questions · {dataset.name}", retries=2, retry_delay_seconds=5,
      cache_policy=NO_CACHE)
def load_and_store_questions(db: str, dataset: DatasetConfig) -> pl.DataFrame:
    """The dataset's questions (limit/seed applied), upserted into the `questions` table."""
    questions = load_questions(dataset.name, source_argument(dataset.source), split=dataset.split,
                               limit=dataset.limit, seed=dataset.seed)
    with Store.open(db, wait_s=60) as store:
        store.upsert("questions", questions)
    return questions
