"""Literal, loop-by-loop reference implementations of the searches, written from the paper and the literature.

Deliberately naive (O(N^2), scipy's beta.ppf): the fast code must agree with these on every case.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from cic.stats import bounds


def literal_ucb(bound: str, fd: int, n: int, gamma: float) -> float:
    if n == 0:
        return 1.0
    if bound == "hoeffding":
        return fd / n + math.sqrt(math.log(1 / gamma) / (2 * n))
    if bound == "cp":
        return 1.0 if fd == n else float(stats.beta.ppf(1 - gamma, fd + 1, n - fd))
    return float(bounds.ucb(bound, fd, n, gamma))


def algorithm1(scores: np.ndarray, errors: np.ndarray, alpha: float, delta: float, bound: str) -> float | None:
    """Algorithm 1 of the paper, line by line."""
    order = np.argsort(scores, kind="stable")
    u, a = scores[order], 1 - errors[order]
    t_hat = None
    for i in range(len(u)):
        t = u[i]
        n = int(np.sum(u <= t))
        fd = int(np.sum((u <= t) & (a == 0)))
        if literal_ucb(bound, fd, n, delta) <= alpha:
            t_hat = float(t)
    return t_hat


def bonferroni(scores: np.ndarray, errors: np.ndarray, grid: np.ndarray, alpha: float, delta: float,
               bound: str) -> float | None:
    t_hat = None
    for t in grid:
        n = int(np.sum(scores <= t))
        fd = int(np.sum((scores <= t) & (errors == 1)))
        if literal_ucb(bound, fd, n, delta / len(grid)) <= alpha:
            t_hat = float(t)
    return t_hat


def fixed_sequence(scores: np.ndarray, errors: np.ndarray, alpha: float, delta: float, bound: str,
                   n_min: int = 1, start: float | None = None) -> float | None:
    candidates = sorted(set(scores.tolist()) | ({start} if start is not None else set()))
    t_hat = None
    for t in candidates:
        n = int(np.sum(scores <= t))
        if n < n_min or (start is not None and t < start):
            continue
        fd = int(np.sum((scores <= t) & (errors == 1)))
        if literal_ucb(bound, fd, n, delta) > alpha:
            break
        t_hat = float(t)
    return t_hat


def p_value(bound: str, fd: int, n: int, alpha: float) -> float:
    """The smallest level at which the bound certifies alpha: exact binomial tail (CP) or Hoeffding's."""
    if n == 0:
        return 1.0
    if bound == "cp":
        return float(stats.binom.cdf(fd, n, alpha))
    if bound == "hoeffding":
        gap = alpha - fd / n
        return math.exp(-2 * n * gap * gap) if gap > 0 else 1.0
    raise ValueError(bound)


def holm(scores: np.ndarray, errors: np.ndarray, grid: np.ndarray, alpha: float, delta: float,
         bound: str) -> float | None:
    """Holm (1979) step-down with p-values: sort them, reject while p_(i) <= delta / (K - i + 1)."""
    p = []
    for t in grid:
        n = int(np.sum(scores <= t))
        fd = int(np.sum((scores <= t) & (errors == 1)))
        p.append(p_value(bound, fd, n, alpha))
    order = np.argsort(p, kind="stable")
    rejected: list[float] = []
    k = len(grid)
    for i, j in enumerate(order):
        if p[j] > delta / (k - i):
            break
        rejected.append(float(grid[j]))
    return max(rejected) if rejected else None


def multistart(scores: np.ndarray, errors: np.ndarray, alpha: float, delta: float, bound: str, n_starts: int,
               n_min: int) -> float | None:
    """S fixed-sequence chains at delta / S from equally spaced eligible candidates; the largest success."""
    candidates = sorted(set(scores.tolist()))
    eligible = [t for t in candidates if int(np.sum(scores <= t)) >= n_min]
    m = len(eligible)
    starts = sorted({i * m // n_starts for i in range(n_starts)}) if m else []
    best = None
    for s in starts:
        for t in eligible[s:]:
            n = int(np.sum(scores <= t))
            fd = int(np.sum((scores <= t) & (errors == 1)))
            if literal_ucb(bound, fd, n, delta / n_starts) > alpha:
                break
            best = t if best is None else max(best, t)
    return best


def geometric(scores: np.ndarray, errors: np.ndarray, alpha: float, delta: float, bound: str,
              chains: list[tuple[int, float]]) -> float | None:
    """Fixed-sequence chains, each from the first score with at least `first` accepted answers at its `level`;
    the largest success (the chains' starts and levels written out by the test)."""
    candidates = sorted(set(scores.tolist()))
    best = None
    for first, level in chains:
        for t in (t for t in candidates if int(np.sum(scores <= t)) >= first):
            n = int(np.sum(scores <= t))
            fd = int(np.sum((scores <= t) & (errors == 1)))
            if literal_ucb(bound, fd, n, level) > alpha:
                break
            best = t if best is None else max(best, t)
    return best


def fallback(scores: np.ndarray, errors: np.ndarray, alpha: float, delta: float, bound: str,
             entries: list[tuple[int, float]], seed: int = 0) -> float | None:
    """The graphical procedure written out: each distinct score a hypothesis with the summed levels of the entries
    whose count it is the first to reach; repeatedly, in a random order, reject any hypothesis whose literal UCB
    at its current level is <= alpha and hand its level to the next unrejected score, until nothing changes (a
    graphical procedure's result does not depend on the order). The largest rejected score."""
    candidates = sorted(set(scores.tolist()))
    counts = [int(np.sum(scores <= t)) for t in candidates]
    level = [0.0] * len(candidates)
    for first, share in entries:
        at = next((i for i, c in enumerate(counts) if c >= first), None)
        if at is not None:
            level[at] += share
    rejected = [False] * len(candidates)
    order = np.random.default_rng(seed)
    changed = True
    while changed:
        changed = False
        for i in order.permutation(len(candidates)):
            if rejected[i] or level[i] <= 0:
                continue
            fd = int(np.sum((scores <= candidates[i]) & (errors == 1)))
            if literal_ucb(bound, fd, counts[i], level[i]) <= alpha:
                rejected[i], changed = True, True
                nxt = next((j for j in range(i + 1, len(candidates)) if not rejected[j]), None)
                if nxt is not None:
                    level[nxt] += level[i]
                level[i] = 0.0
    hits = [t for t, r in zip(candidates, rejected, strict=True) if r]
    return max(hits) if hits else None
