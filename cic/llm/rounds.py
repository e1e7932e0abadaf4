"""Adaptive sampling in rounds: the open-ended questions of a batch draw their samples round by round (the most
likely answer and samples 1-2, then 3-4, 5-6, 7-10), every round's still-open questions in one engine call, and a
question leaves once its samples settle the score — one meaning set, or from four on each its own
(`cic.llm.uncertainty.adaptive`: the rule reads that question's answers only, never a label). The rows stored are
exactly those drawn, in drawn order, so the scorer's replay of the rule stops where the sampler did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cic import schema
from cic.llm.uncertainty.adaptive import round_indices, stop_in
from cic.llm.uncertainty.equivalence import cluster_many

if TYPE_CHECKING:
    import polars as pl


@dataclass
class Rounds:
    """What the rounds drew: the rows, and how many questions each round's one engine call asked."""

    rows: pl.DataFrame
    asked: list[int] = field(default_factory=list)


def draw_in_rounds(engine: Any, question_ids: Sequence[str], prompts: Sequence[Any], *, run_key: str,
                   rounds: Sequence[int], equivalence: Any) -> Rounds:
    """GENERATIONS rows of open-ended questions drawn under the adaptive rule. A question that got no answer in a
    round it needed (a served model's failure, which the engine reports) keeps no row, so a rerun asks it whole."""
    import polars as pl

    drawn: dict[str, list[str]] = {str(q): [] for q in question_ids}
    parts, asked, open_, closed = [], [], list(range(len(question_ids))), set()
    for indices in round_indices(rounds):
        ids = [str(question_ids[i]) for i in open_]
        frame = engine.generate_open(ids, [prompts[i] for i in open_], run_key=run_key, indices=indices)
        parts.append(frame)
        asked.append(len(ids))
        samples = frame.filter(pl.col("sample_index") >= 1).sort("question_id", "sample_index")
        for qid, texts in samples.group_by("question_id", maintain_order=True).agg(pl.col("text")).iter_rows():
            drawn[qid].extend(texts)
        answered = set(samples.get_column("question_id").to_list())
        still = [i for i in open_ if str(question_ids[i]) in answered]
        clusters = cluster_many([drawn[str(question_ids[i])] for i in still], equivalence)
        open_ = []
        for i, ids_ in zip(still, clusters, strict=True):
            if stop_in(ids_.tolist(), rounds) is None:
                open_.append(i)
            else:
                closed.add(str(question_ids[i]))
        if not open_:
            break
    rows = pl.concat([schema.conform(p, schema.GENERATIONS) for p in parts])
    return Rounds(rows.filter(pl.col("question_id").is_in(sorted(closed))).sort("question_id", "sample_index"), asked)

