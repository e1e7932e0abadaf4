"""Adaptive sample counts: draw a question's samples in rounds and stop once its meaning sets say the score is
settled — a rule that reads that question's samples only, never a label, fixed before calibration. The score of
the samples drawn is then an estimator of its own (`semantic_entropy[adaptive:2-10]`), calibrated like any other:
the certificate's exchangeability argument needs nothing else (docs/statistics.md, `infra/scripts/
adaptive_validity_table.py`).

Rule `settled`: after each round, stop when every sample so far falls in one meaning set (the score is then 0), or
when — from `SPLIT_FROM` samples on — every sample so far is a meaning set of its own (the score is then as high as
that many samples allow: a gate that answers such a question answers nearly everything). Rounds are cumulative
sample counts. Measured on the real model's stored samples (`infra/scripts/adaptive_real_table.py`): at
temperature 1 its first two samples rarely agree, so the agreeing side alone saved 2% of the generations; most
saving is on the other side.

A sampler following the rule (`cic.llm.rounds`) stores the samples it drew; the scorer replays the rule on stored
samples (`stop_in`), so a run that drew all 10 and a run that stopped early score the same prefix the same way —
meaning sets are found online (an answer's set depends on the answers before it only), so the sets of a prefix are
the prefix of the sets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUNDS: tuple[int, ...] = (2, 4, 6, 10)
SPLIT_FROM = 4  # fewer all-distinct samples settle nothing: two samples that differ are most questions' first two


def checked_rounds(rounds: Sequence[int]) -> tuple[int, ...]:
    """Rounds as cumulative sample counts: increasing, the first at least 2 (one sample settles nothing)."""
    counts = tuple(int(r) for r in rounds)
    if not counts or counts[0] < 2 or any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
        raise ValueError(f"rounds = {list(rounds)!r}: increasing sample counts, the first at least 2")
    return counts


def samples_drawn(clusters: Sequence[int], rounds: Sequence[int] = ROUNDS) -> int:
    """How many of a question's samples (meaning-set ids in the order they were drawn) the rule draws: the first
    round that `settles` it, else the last round."""
    counts = checked_rounds(rounds)
    if len(clusters) < counts[-1]:
        raise ValueError(f"{len(clusters)} samples given; the rounds draw up to {counts[-1]}")
    return next((count for count in counts if settles(clusters[:count])), counts[-1])


def settles(drawn: Sequence[int]) -> bool:
    """Whether the samples drawn so far settle the score: all in one meaning set, or (from SPLIT_FROM samples on)
    each in its own."""
    sets = len(set(drawn))
    return sets == 1 or (len(drawn) >= SPLIT_FROM and sets == len(drawn))


def stop_in(clusters: Sequence[int], rounds: Sequence[int] = ROUNDS) -> int | None:
    """The rule replayed on stored samples (meaning-set ids in drawn order): how many it uses, or None where the
    samples end before the rule would have stopped (an incomplete record: no score from it)."""
    counts = checked_rounds(rounds)
    for count in counts:
        if count > len(clusters):
            return None
        if settles(clusters[:count]):
            return count
    return counts[-1]


def round_indices(rounds: Sequence[int] = ROUNDS) -> list[list[int]]:
    """The rows each round draws: the most likely answer (0) and samples 1-2 first, then each round's new samples."""
    counts = checked_rounds(rounds)
    return [([0] if i == 0 else []) + list(range(1 if i == 0 else counts[i - 1] + 1, count + 1))
            for i, count in enumerate(counts)]


def adaptive_semantic_entropy(clusters: Sequence[int], rounds: Sequence[int] = ROUNDS) -> tuple[float, int]:
    """(semantic entropy of the samples the rule draws, how many it drew)."""
    drawn = samples_drawn(clusters, rounds)
    counts = np.unique(np.asarray(clusters[:drawn]), return_counts=True)[1]
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum()) + 0.0, drawn


def adaptive_name(base: str, rounds: Sequence[int] = ROUNDS) -> str:
    """The stored name of a score computed under the rule: `semantic_entropy[adaptive:2-10]`."""
    counts = checked_rounds(rounds)
    return f"{base}[adaptive:{counts[0]}-{counts[-1]}]"
