"""Statistic calculators (LM-Polygraph's split): each computes one expensive statistic of a question — meaning
classes, the samples' similarity graph, its Laplacian's spectrum — and declares what it depends on; a small graph
orders them, so a question computes each statistic once, after what it reads, and only where some estimator needs
it. A new statistic is a new `Calculator` (or a `cic.calculators` entry point); the estimators stay pure functions
of `QuestionStats`.

    clusters ──► similarity ──► laplacian_eigen        (eigv, deg, ecc read these; semantic entropy reads clusters)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.llm.uncertainty.equivalence import cluster_answers
from cic.registry import Registry


@dataclass(frozen=True)
class Calculator:
    """One statistic: its name (what estimators list in `needs`), how it is computed from a question's
    `QuestionStats` (reading the statistics it `depends_on` through `stats.stat(name)`), and a line for people."""

    name: str
    compute: Callable[[Any], Any]
    depends_on: tuple[str, ...] = ()
    help: str = ""


def _clusters(stats: Any) -> np.ndarray:
    """Meaning classes of the samples (letters are compared exactly for multiple choice)."""
    if stats.is_multiple_choice:
        _, ids = np.unique(np.array(stats.texts, dtype=object), return_inverse=True)
        return ids.astype(np.int64)
    return cluster_answers(stats.texts, stats.equivalence)


def _similarity(stats: Any) -> np.ndarray:
    """Symmetric [K, K] similarity in [0, 1]: the equivalence's own grades (embedding cosine, clipped) where it
    grades, else the 0/1 same-class adjacency."""
    own = getattr(stats.equivalence, "similarities", None)
    if own is not None and not stats.is_multiple_choice:
        return own(stats.texts)
    c = stats.stat("clusters")
    return (c[:, None] == c[None, :]).astype(np.float64)


def _laplacian_eigen(stats: Any) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of L = I − D^{-1/2} W D^{-1/2}."""
    w = stats.stat("similarity")
    d = w.sum(axis=1)
    inv = 1.0 / np.sqrt(d)
    lap = np.eye(len(w)) - inv[:, None] * w * inv[None, :]
    return np.linalg.eigh((lap + lap.T) / 2)


CALCULATORS: Registry[Calculator] = Registry("statistic", (
    Calculator("clusters", _clusters, help="meaning classes of the samples (the equivalence: its name enters the "
                                            "stored estimator name)"),
    Calculator("similarity", _similarity, ("clusters",), help="pairwise similarity of the samples (the "
                                                                "equivalence's, or its embeddings')"),
    Calculator("laplacian_eigen", _laplacian_eigen, ("similarity",), help="spectrum of the similarity graph's "
                                                                           "normalised Laplacian"),
), base=Calculator, group="cic.calculators")


def calculation_order(names: Iterable[str]) -> list[str]:
    """The statistics `names` need, each after what it depends on (a depth-first topological order); an unknown
    statistic or a cycle is refused naming it."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise UserError(f"statistic {name!r}: depends on itself ({' -> '.join([*visiting, name])})")
        calculator = CALCULATORS.lookup(name)
        visiting.append(name)
        for dependency in calculator.depends_on:
            visit(dependency)
        visiting.pop()
        order.append(name)

    for name in names:
        visit(name)
    return order


def closure(names: Iterable[str]) -> frozenset[str]:
    """`names` with every statistic they depend on, directly or not (data needs pass through unchanged)."""
    known = [n for n in names if CALCULATORS.find(n) is not None]
    return frozenset(calculation_order(known)) | frozenset(names)
