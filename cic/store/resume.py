"""What a generation run still lacks in the store, so a rerun redoes nothing and a killed run resumes.

A question is complete for a run when it has the most-likely answer plus every sample, a score row per
configured estimator and a label per criterion. Batches are written in one transaction, so a kill leaves
each question either complete or untouched by that batch; questions whose generations are stored but whose
scores or labels are not (e.g. a new estimator was added to the config) are re-scored without regenerating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from cic.store import Store


@dataclass(frozen=True)
class RunWork:
    """The unfinished part of one run: questions to generate, and questions only to score and label."""

    run_key: str
    to_generate: list[str]
    to_score: list[str]


def missing_work(store: Store, run_key: str, question_ids: Sequence[str], *, n_samples: int,
                 estimators: Sequence[str], criteria: Sequence[str],
                 adaptive: Sequence[int] | None = None) -> RunWork:
    """Split the run's questions into done, to score/label only, and to generate; `estimators` are the stored
    score names (a score of each is needed), `criteria` the label names. Under adaptive rounds a question is
    generated once it has its first round's rows: a batch stores only questions whose rounds ended, all at once."""
    fewest = (adaptive[0] if adaptive else n_samples) + 1
    ungenerated = store.missing_questions(run_key, question_ids, table="generations", min_rows=fewest)
    unscored: set[str] = set()
    for estimator in estimators:
        unscored |= set(store.missing_questions(run_key, question_ids, table="scores", estimator=estimator))
    for criterion in criteria:
        unscored |= set(store.missing_questions(run_key, question_ids, table="labels", criterion=criterion))
    pending = set(ungenerated)
    return RunWork(run_key, ungenerated, [q for q in question_ids if q in unscored and q not in pending])


def stored_generations(store: Store, run_key: str, question_ids: Sequence[str]) -> pl.DataFrame:
    """The stored generation rows of these questions (for re-scoring without regenerating)."""
    if not question_ids:
        from cic import schema

        return pl.DataFrame(schema=schema.GENERATIONS.schema)
    return store.read("generations", run_key=run_key, question_id=list(question_ids))
