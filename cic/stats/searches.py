"""Threshold searches as objects: which candidates a search tests, at which level, and which one it returns.

A search sees candidate thresholds in ascending order with their accepted counts n and error counts FD, one
row per calibration set (the split protocol and the simulator run many rows at once), and a feasibility
oracle `feasible_at(gamma)` giving, for every cell, whether the bound certifies alpha at level gamma. Each
search states its guarantee once, here; `calibrate`, the split protocol, the simulator, the baselines table,
the reports and the CLI all read it from `SEARCHES`. Adding a search is adding one object.

Guarantees are about the hypotheses H_t: R(t) > alpha, R(t) = P(error | U <= t); "FWER <= delta" means
P(the returned threshold has R > alpha) <= delta.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FeasibleAt = Callable[[float], np.ndarray]


@dataclass(frozen=True)
class Setting:
    """What a search may know besides the counts: the calibration size, the bound and alpha (never labels)."""

    n_calibration: int
    bound: str
    alpha: float


def last_true(mask: np.ndarray) -> np.ndarray:
    """Per row, the index of the last True column, or -1."""
    idx = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), idx, -1)


@dataclass(frozen=True)
class Search:
    """A threshold search: its candidates, its per-test level, its selection rule and its guarantee.

    Candidates are a grid fixed in advance when `grid` is given (required where `needs_grid`), else every
    unique calibration score. `first_test` searches (fixed-sequence family) accept `n_min` / `start`: the
    first hypothesis tested, fixed before the labels are seen.
    """

    name: str
    label: str
    guarantee: str
    guarantee_kind: str  # "high-probability" or "none"
    short_guarantee: str = "FWER <= delta"  # what a table column says
    claim: str = ""  # one line for the baselines table
    needs_grid: bool = False
    takes_grid: bool = True
    first_test: bool = False

    def level(self, delta: float, k: int) -> float:
        """The level each hypothesis is tested at (the first one, for step-down procedures)."""
        return delta

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the chosen column (-1: none) and the level it was certified at. `counts` (accepted count per
        column) and `setting` (calibration size, bound, alpha) are for searches whose chains depend on them."""
        raise NotImplementedError

    def default_n_min(self, bound: str, alpha: float, delta: float) -> int | None:
        """The first accepted count tested when neither n_min nor start is given (None: no floor)."""
        return None

    def check_args(self, grid: Any, n_min: Any, start: Any) -> None:
        """Refuse arguments this search does not take, naming them."""
        if grid is not None and not self.takes_grid:
            raise ValueError(f"grid was given but search = {self.name!r} scans every unique calibration score; "
                             "use search = 'bonferroni', 'holm' or 'fixed_sequence' for a grid")
        if grid is None and self.needs_grid:
            raise ValueError(f"search = {self.name!r} needs grid: a threshold grid fixed before seeing the labels "
                             "(cic.uniform_grid(low, high, k) or cic.quantile_grid(pilot_scores, k))")
        if not self.first_test and (n_min is not None or start is not None):
            raise ValueError(f"n_min = {n_min!r} / start = {start!r} apply to the fixed-sequence searches only "
                             f"(search = {self.name!r})")


@dataclass(frozen=True)
class LargestFeasible(Search):
    """Every eligible candidate tested at one level; the largest that passes is returned."""

    divide_by_k: bool = False

    def level(self, delta: float, k: int) -> float:
        return delta / k if self.divide_by_k else delta

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        gamma = self.level(delta, k)
        return last_true(feasible_at(gamma) & eligible), np.full(eligible.shape[0], gamma)


@dataclass(frozen=True)
class Holm(Search):
    """Holm's step-down over K grid points: reject H_(i) while p_(i) <= delta / (K - i + 1).

    With feasibility at level gamma meaning p <= gamma, the rejected set is the fixed point of
    r <- #{feasible at delta / (K - r)}, reached from r = 0 in at most K steps (each step only grows r).
    """

    def level(self, delta: float, k: int) -> float:
        return delta / k

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        rows = eligible.shape[0]
        k_eff = eligible.sum(axis=1)
        rejected = np.zeros(rows, dtype=np.int64)
        chosen = np.full(rows, -1, dtype=np.int64)
        level = np.full(rows, np.nan)
        active = k_eff > 0
        cache: dict[int, np.ndarray] = {}
        while active.any():
            grown = np.zeros(rows, dtype=bool)
            for r in np.unique(rejected[active]):
                in_step = active & (rejected == r)
                for remaining in np.unique(k_eff[in_step] - r):
                    these = in_step & (k_eff - r == remaining)
                    gamma = delta / remaining
                    if remaining not in cache:
                        cache[int(remaining)] = feasible_at(gamma)
                    passing = cache[int(remaining)][these] & eligible[these]
                    count = passing.sum(axis=1)
                    chosen[these] = np.where(count > 0, last_true(passing), -1)
                    level[these] = gamma
                    grown[these] = (count > r) & (count < k_eff[these])
                    rejected[these] = np.maximum(count, r)
            active = grown
        return chosen, level


@dataclass(frozen=True)
class FixedSequence(Search):
    """Fixed-sequence testing upward from S starts, each chain at delta / S, stopping at its first failure.

    S = 1 is classic fixed-sequence testing; S > 1 starts chains at S equally spaced eligible candidates
    (LTT's multi-start), so a bump in R(t) stops one chain, not the search.
    """

    n_starts: int = 1

    def level(self, delta: float, k: int) -> float:
        return delta / self.n_starts

    def default_n_min(self, bound: str, alpha: float, delta: float) -> int | None:
        from cic.stats.bounds import half_alpha_n

        return half_alpha_n(bound, alpha, self.level(delta, 1))

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        gamma = self.level(delta, k)
        feasible = feasible_at(gamma)
        rows, cols = eligible.shape
        col = np.arange(cols)
        if self.n_starts == 1:
            failed = eligible & ~feasible
            first_fail = np.where(failed.any(axis=1), np.argmax(failed, axis=1), cols)
            return last_true(eligible & (col[None, :] < first_fail[:, None])), np.full(rows, gamma)
        # next failure at or after each column; last eligible column at or before each column
        failed = eligible & ~feasible
        next_fail = np.where(failed, col[None, :], cols)
        next_fail = np.minimum.accumulate(next_fail[:, ::-1], axis=1)[:, ::-1]
        last_eligible = np.maximum.accumulate(np.where(eligible, col[None, :], -1), axis=1)
        rank = np.cumsum(eligible, axis=1) - 1  # 0-based rank among eligible columns
        m = eligible.sum(axis=1, keepdims=True)
        s = self.n_starts
        # a start is the eligible column of rank floor(i m / S), i = 0..S-1
        i = -(-rank * s // np.maximum(m, 1))
        is_start = eligible & (i < s) & ((i * m) // s == rank)
        stop = np.where(is_start, next_fail, -1)  # chain from a start passes columns [start, next_fail)
        end = np.where(stop > col[None, :], np.take_along_axis(last_eligible, np.maximum(stop - 1, 0), axis=1), -1)
        return end.max(axis=1, initial=-1), np.full(rows, gamma)


@dataclass(frozen=True)
class GeometricStarts(Search):
    """fixed_sequence's chain at 0.9·delta plus chains started at n/2, n/4, ... accepted answers sharing 0.1·delta.

    One early unlucky step can end a chain that starts among the first few accepted answers (where the bound is
    noisy) - the collapse of a single chain, in about a third of draws where alpha is easy. The extra chains
    start at half the calibration set, a quarter, ... (the first with the largest share), down to the last count
    at which a chain's own level can certify an empirical risk of alpha/2 (`bounds.half_alpha_n`): whatever the
    largest valid threshold, some chain starts between half of it and it, where the bound is tight. The bottom
    chain keeps almost all of delta because small calibration sets with a small certifiable region (the real
    example) need it. Starts and levels depend on (n, bound, alpha, delta) and the score ranks only; the evidence
    is `infra/scripts/search_power_table.py` and docs/statistics.md.
    """

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        if counts is None or setting is None:
            raise ValueError(f"search = {self.name!r} needs the accepted counts and the calibration setting")
        rows, cols = eligible.shape
        counts = np.broadcast_to(counts, eligible.shape)
        col = np.arange(cols)
        last_eligible = np.maximum.accumulate(np.where(eligible, col[None, :], -1), axis=1)
        best, level = np.full(rows, -1, dtype=np.int64), np.full(rows, np.nan)
        for start_count, gamma in geometric_chains(setting.n_calibration, setting.bound, setting.alpha, delta):
            tested = eligible & (counts >= start_count)
            start = np.where(tested.any(axis=1), np.argmax(tested, axis=1), cols)
            failed = eligible & ~feasible_at(gamma) & (col[None, :] >= start[:, None])
            stop = np.where(failed.any(axis=1), np.argmax(failed, axis=1), cols)
            end = np.where(stop > start, last_eligible[np.arange(rows), np.maximum(stop - 1, 0)], -1)
            better = end > best
            best, level = np.where(better, end, best), np.where(better, gamma, level)
        return best, level


BOTTOM_SHARE = 0.9  # of delta, for the chain from the first count that can certify (the rest: geometric starts)


@functools.lru_cache(maxsize=4096)
def geometric_chains(n_calibration: int, bound: str, alpha: float, delta: float) -> tuple[tuple[int, float], ...]:
    """The (first accepted count, level) of each chain of the geometric search.

    A bottom chain at delta·BOTTOM_SHARE from `half_alpha_n` (fixed_sequence's first test at its level: where a
    small certifiable region lies), then chains from ceil(n / 2^k), k = 1..J, sharing the rest as rest·(1/k)/H_J,
    J the most chains whose last one starts where its own level can certify an empirical risk of alpha/2.
    """
    from cic.stats.bounds import half_alpha_n

    bottom = delta * BOTTOM_SHARE
    rest = delta - bottom
    chains: tuple[tuple[int, float], ...] = ()
    harmonic = 0.0
    for j in range(1, 64):
        harmonic += 1.0 / j
        first = -(-n_calibration // 2**j)
        if first < 1 or first < half_alpha_n(bound, alpha, rest / (j * harmonic)):
            break
        chains = tuple((-(-n_calibration // 2**i), rest / (i * harmonic)) for i in range(1, j + 1))
    if not chains:  # too few answers for any geometric chain: the bottom chain alone, at delta
        return ((half_alpha_n(bound, alpha, delta), delta),)
    return ((half_alpha_n(bound, alpha, bottom), bottom), *chains)


SEARCHES: dict[str, Search] = {s.name: s for s in (
    GeometricStarts(
        "geometric", "fixed sequence, geometric starts",
        "FWER <= delta: fixed-sequence chains, each testing every calibration score upward from its start and "
        "stopping at its first failure: one at 0.9·delta from the first count that can certify (as fixed_sequence), "
        "and chains from n/2, n/4, ... accepted answers sharing 0.1·delta, chain k at 0.1·delta·(1/k)/H_J (a union "
        "bound over chains); the largest threshold any chain certifies is returned. Starts and levels are fixed by "
        "(n, bound, alpha, delta) before the labels are seen, so the guarantee holds conditionally on the scores "
        "whatever the shape of R(t); some chain starts where the bound is tight, so one early unlucky step does not "
        "end the search",
        "high-probability", takes_grid=False, first_test=True,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (a fixed-sequence chain at 0.9·delta, chains from n/2, n/4, ... "
              "sharing 0.1·delta)"),
    FixedSequence(
        "fixed_sequence", "fixed sequence",
        "FWER <= delta: candidates tested upward at level delta from the first hypothesis (start, or the n_min-th "
        "smallest calibration score), stopping at the first failure (Learn-then-Test fixed-sequence testing). "
        "Candidates are the calibration scores (or a grid), so the guarantee holds conditionally on the scores, "
        "whatever the shape of R(t); exact with a start threshold fixed in advance",
        "high-probability", first_test=True,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (fixed-sequence testing from the n_min-th score)"),
    FixedSequence(
        "multistart", "fixed sequence, 4 starts",
        "FWER <= delta: four fixed-sequence chains, each at level delta / 4, started at equally spaced candidates "
        "from the n_min-th score (union bound over chains); robust when R(t) is not monotone",
        "high-probability", first_test=True, n_starts=4,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (4 fixed-sequence chains, each at delta / 4)"),
    Holm(
        "holm", "Holm step-down",
        "FWER <= delta (Holm 1979): grid of K thresholds fixed before the labels, step-down levels "
        "delta / K, delta / (K - 1), ...; uniformly at least as powerful as Bonferroni",
        "high-probability", needs_grid=True,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (Holm step-down over a grid fixed in advance)"),
    LargestFeasible(
        "bonferroni", "Bonferroni",
        "P(R(t_hat) <= alpha or no threshold) >= 1 - delta (paper Theorem 2): grid of K thresholds fixed before "
        "the labels, each tested at delta / K",
        "high-probability", needs_grid=True, divide_by_k=True,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (Theorem 2, grid fixed in advance, each at delta / K)"),
    LargestFeasible(
        "paper", "paper (Algorithm 1)",
        "none simultaneous: every unique calibration score is tested at level delta with no multiplicity "
        "correction (Algorithm 1 as printed); Theorem 1 covers each fixed threshold, not the data-chosen "
        "maximum, whose violation rate can exceed delta (cic validity)",
        "none", short_guarantee="none simultaneous", takes_grid=False,
        claim="none for the chosen threshold: P(R(t) <= alpha) >= 1 - delta holds for each fixed t only"),
)}
SEARCH_NAMES: tuple[str, ...] = tuple(SEARCHES)
DEFAULT_SEARCH = "geometric"  # why: docs/statistics.md, "The default search"

_MULTISTART = re.compile(r"^multistart\[(\d+)\]$")


def get_search(name: Any) -> Search:
    """The search object named `name`; `multistart[S]` gives fixed-sequence testing from S starts."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key in SEARCHES:
            return SEARCHES[key]
        match = _MULTISTART.match(key)
        if match and int(match[1]) >= 1:
            s = int(match[1])
            base = SEARCHES["multistart"]
            return FixedSequence(key, f"fixed sequence, {s} starts", base.guarantee.replace(
                "four fixed-sequence chains, each at level delta / 4", f"{s} fixed-sequence chains, each at level "
                f"delta / {s}"), "high-probability", first_test=True, n_starts=s,
                claim=base.claim.replace("4 fixed-sequence chains, each at delta / 4",
                                         f"{s} fixed-sequence chains, each at delta / {s}"))
    raise ValueError(f"search = {name!r}: unknown; choose one of {', '.join(SEARCH_NAMES)} (or multistart[S])")


def feasibility_table(bound: str, n_max: int, alpha: float, gamma: float) -> np.ndarray:
    """Largest feasible FD for every accepted count 0..n_max (the gather table of `feasibility`)."""
    from cic.stats import bounds as _bounds

    return _bounds.max_errors(bound, np.arange(int(n_max) + 1), alpha, gamma)

