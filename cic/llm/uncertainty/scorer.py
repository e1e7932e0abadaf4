"""Score generations: build each question's shared statistics once, then run every requested estimator.

The meaning classes of every open-ended question in a batch are found together (`cluster_many`), so the
equivalence model sees one batched call per round instead of one small call per answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from cic import schema
from cic.errors import UserError
from cic.llm.uncertainty.adaptive import stop_in
from cic.llm.uncertainty.calculators import closure
from cic.llm.uncertainty.equivalence import cluster_many
from cic.llm.uncertainty.estimators import finite_or_none, get_estimator, stored_name
from cic.llm.uncertainty.statistics import QuestionStats


class UncertaintyScorer:
    """SCORES rows (one per question × estimator; null where an estimator does not apply).

    With `adaptive` rounds every estimator that reads samples scores the samples the adaptive rule uses
    (`adaptive.stop_in`, replayed on the stored samples in drawn order; null where they end before it stops) and
    its name says so; one-pass estimators read the most likely answer as ever, and a multiple-choice question
    every letter drawn (they cost no generation)."""

    def __init__(self, equivalence: Any, estimators: Sequence[str], adaptive: Sequence[int] | None = None) -> None:
        self.estimators = [get_estimator(name) for name in estimators]
        if not self.estimators:
            raise UserError("estimators is empty: name at least one")
        self.equivalence = equivalence
        self.adaptive = tuple(adaptive) if adaptive else None

    def stored_names(self) -> list[str]:
        """The estimator names as they appear in the scores table."""
        return [stored_name(e.name, self.equivalence.name, self.adaptive) for e in self.estimators]

    def question_stats(self, rows: pl.DataFrame) -> QuestionStats:
        """Statistics of one question's generation rows (samples = sample_index ≥ 1, or the greedy alone; the
        greedy answer's own log-probabilities beside them, for the one-pass estimators)."""
        samples = rows.filter(pl.col("sample_index") >= 1).sort("sample_index")
        if samples.height == 0:
            samples = rows
        probs = rows.get_column("option_probs")[0]
        has_logprobs = samples.get_column("logprob_sum").null_count() == 0
        greedy = rows.filter(pl.col("sample_index") == 0)
        return QuestionStats(
            question_id=str(rows.get_column("question_id")[0]), texts=samples.get_column("text").to_list(),
            logprob_sum=samples.get_column("logprob_sum").fill_null(0.0).to_numpy(),
            logprob_mean=samples.get_column("logprob_mean").fill_null(0.0).to_numpy(),
            option_probs=None if probs is None else np.asarray(probs.to_list() if hasattr(probs, "to_list")
                                                               else probs, dtype=np.float64),
            equivalence=self.equivalence, has_logprobs=has_logprobs,
            greedy_logprob_sum=greedy.get_column("logprob_sum")[0] if greedy.height else None,
            greedy_logprob_mean=greedy.get_column("logprob_mean")[0] if greedy.height else None)

    def score(self, generations: pl.DataFrame, *, run_key: str) -> pl.DataFrame:
        records = []
        names = self.stored_names()
        every = [self.question_stats(rows) for _, rows in generations.group_by("question_id", maintain_order=True)]
        graded = getattr(self.equivalence, "similarities", None) is not None
        needs_clusters = self.adaptive is not None or any(  # a graded equivalence's similarity clusters nothing
            "clusters" in e.needs or (not graded and "clusters" in closure(e.needs)) for e in self.estimators)
        open_ended = [stats for stats in every if not stats.is_multiple_choice and needs_clusters]
        for stats, ids in zip(open_ended, cluster_many([s.texts for s in open_ended], self.equivalence), strict=True):
            stats.set_clusters(ids)
        for stats in every:
            question_id = stats.question_id
            drawn = self.drawn(stats)
            for estimator, name in zip(self.estimators, names, strict=True):
                used = stats if estimator.one_pass else drawn
                value = None if used is None or estimator.lacking(used) else estimator.compute(used)
                records.append({"run_key": run_key, "question_id": str(question_id), "estimator": name,
                                "value": finite_or_none(value)})
        return schema.conform(pl.DataFrame(records, schema=schema.SCORES.schema), schema.SCORES)

    def drawn(self, stats: QuestionStats) -> QuestionStats | None:
        """The samples the estimators read: all of them, or under the adaptive rule those it uses (None: the
        stored samples end before the rule stops). A multiple-choice question's letters are draws from its one
        forward pass — free — so it reads them all."""
        if self.adaptive is None or stats.is_multiple_choice:
            return stats
        count = stop_in(stats.clusters.tolist(), self.adaptive)
        return None if count is None else stats.first(count)
