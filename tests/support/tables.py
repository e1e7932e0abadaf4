"""Reproducible random (score, error) tables for the statistics tests."""

from __future__ import annotations

import numpy as np


def make_table(rng: np.random.Generator, n: int, *, decimals: int | None = 2, slope: float = 0.5,
               base: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Scores in [0, 1] (rounded so ties occur) whose error probability grows with the score."""
    scores = rng.random(n)
    if decimals is not None:
        scores = np.round(scores, decimals)
    errors = (rng.random(n) < np.clip(base + slope * scores, 0, 1)).astype(np.int8)
    return scores, errors
