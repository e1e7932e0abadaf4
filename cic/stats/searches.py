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

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.registry import Registry
from cic.stats import bounds
from cic.stats._validation import as_grid, check_positive_int
from cic.stats.entries import BOTTOM_SHARE, fallback_entries, geometric_chains, tied_entries  # noqa: F401
from cic.stats.sequential import Chain, FeasibleAt, SequentialHooks, Setting


class FeasibilityTables:
    """The largest feasible FD per accepted count, per level, computed in blocks of `BLOCK` counts only where a
    search asks and kept: the next split of the split protocol, the next block of the simulator reuse them. On
    10^7 pairs a fixed-sequence scan stops at its first failure, so it needs the blocks up to there, not a table
    over five million counts per level."""

    BLOCK = 1 << 14

    def __init__(self, bound: str, alpha: float, n_max: int) -> None:
        self.bound, self.alpha, self.n_max = bound, alpha, int(n_max)
        self._blocks: dict[tuple[float, int], np.ndarray] = {}

    def _block(self, gamma: float, b: int) -> np.ndarray:
        key = (float(gamma), b)
        if key not in self._blocks:
            counts = np.arange(b * self.BLOCK, min((b + 1) * self.BLOCK, self.n_max + 1))
            self._blocks[key] = bounds.max_errors(self.bound, counts, self.alpha, gamma)
        return self._blocks[key]

    def __call__(self, gamma: float, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Largest feasible FD for the counts lo..hi (default: up to `n_max`), index 0 = count lo."""
        hi = self.n_max if hi is None else min(int(hi), self.n_max)
        lo = max(int(lo), 0)
        if hi < lo:
            return np.zeros(0, dtype=np.int64)
        first, last = lo // self.BLOCK, hi // self.BLOCK
        parts = [self._block(gamma, b) for b in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return joined[lo - first * self.BLOCK:hi - first * self.BLOCK + 1]


def feasibility_oracle(table: FeasibilityTables, n: np.ndarray, fd: np.ndarray, first: int = 0) -> FeasibleAt:
    """`feasible_at(gamma, cols=None)`: whether the bound certifies alpha at level gamma in each cell (of the
    columns `cols`), from the table over the counts those cells hold (from `first`, the first count any search
    may test: a cell below it is not feasible)."""
    def feasible_at(gamma: float, cols: Any = None) -> np.ndarray:
        counts, errors = (n, fd) if cols is None else (n[:, cols], fd[:, cols])
        if counts.size == 0:
            return np.zeros(counts.shape, dtype=bool)
        start = max(first, int(counts.min()))
        span = table(gamma, start, int(counts.max()))
        if span.shape[0] == 0:  # no count in the span (the first testable count lies beyond every count)
            return np.zeros(counts.shape, dtype=bool)
        inside = counts >= start
        return inside & (errors <= span[np.clip(counts - start, 0, span.shape[0] - 1)])
    return feasible_at


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

    @property
    def bins_large_inputs(self) -> bool:
        """Whether a large calibration set may be searched on binned scores instead of a full sort (the paper
        search only: the largest feasible score at one level, no grid, no start)."""
        return False

    def level(self, delta: float, k: int) -> float:
        """The level each hypothesis is tested at (the first one, for step-down procedures)."""
        return delta

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, errors: np.ndarray | None = None,
               setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the chosen column (-1: none) and the level it was certified at. `counts` (accepted count per
        column) and `setting` (calibration size, bound, alpha) are for searches whose chains depend on them;
        `errors` (error count per column) for rules that test the counts without a bound (`lec`)."""
        raise NotImplementedError

    def default_n_min(self, bound: str, alpha: float, delta: float) -> int | None:
        """The first accepted count tested when neither n_min nor start is given (None: no floor)."""
        return None

    def scan_one(self, fd: np.ndarray, n: np.ndarray, eligible: np.ndarray, *, delta: float, k: int,
                 setting: Setting) -> tuple[int, float, int | None] | None:
        """The exact fast path on one calibration set: (chosen index or -1, its level, exact tests run), or None
        where the search has none (`select` then decides through the feasibility tables)."""
        return None

    def certificate(self, bound: str, n_errors: int, n_accepted: int, alpha: float, gamma: float) -> tuple[bool, str]:
        """Whether a stored threshold's counts still satisfy what this search claims for it, and the figure that
        says so (a high-probability search: the bound's UCB at the certified level is <= alpha)."""
        value = float(bounds.ucb(bound, n_errors, n_accepted, gamma))
        return value <= alpha * (1 + 1e-12), f"UCB {value:.4g} > alpha {alpha:g}"

    def check_args(self, grid: Any, n_min: Any, start: Any) -> None:
        """Refuse arguments this search does not take, naming them."""
        if grid is not None and not self.takes_grid:
            raise UserError(f"grid was given but search = {self.name!r} scans every unique calibration score; "
                             "use search = 'bonferroni', 'holm' or 'fixed_sequence' for a grid")
        if grid is None and self.needs_grid:
            raise UserError(f"search = {self.name!r} needs grid: a threshold grid fixed before seeing the labels "
                             "(cic.uniform_grid(low, high, k) or cic.quantile_grid(pilot_scores, k))")
        if not self.first_test and (n_min is not None or start is not None):
            raise UserError(f"n_min = {n_min!r} / start = {start!r} apply to the fixed-sequence searches only "
                             f"(search = {self.name!r})")


@dataclass(frozen=True)
class LargestFeasible(Search):
    """Every eligible candidate tested at one level; the largest that passes is returned."""

    divide_by_k: bool = False

    @property
    def bins_large_inputs(self) -> bool:
        return not self.takes_grid and not self.divide_by_k

    def level(self, delta: float, k: int) -> float:
        return delta / k if self.divide_by_k else delta

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, errors: np.ndarray | None = None,
               setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        gamma = self.level(delta, k)
        return last_true(feasible_at(gamma) & eligible), np.full(eligible.shape[0], gamma)

    def scan_one(self, fd: np.ndarray, n: np.ndarray, eligible: np.ndarray, *, delta: float, k: int,
                 setting: Setting) -> tuple[int, float, int | None] | None:
        if self.takes_grid or not eligible.all():  # a grid is small: the table path is as fast
            return None
        gamma = self.level(delta, k)
        return search_paper(fd, n, bound=setting.bound, alpha=setting.alpha, gamma=gamma), gamma, None


@dataclass(frozen=True)
class Holm(Search):
    """Holm's step-down over K grid points: reject H_(i) while p_(i) <= delta / (K - i + 1).

    With feasibility at level gamma meaning p <= gamma, the rejected set is the fixed point of
    r <- #{feasible at delta / (K - r)}, reached from r = 0 in at most K steps (each step only grows r).
    """

    def level(self, delta: float, k: int) -> float:
        return delta / k

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, errors: np.ndarray | None = None,
               setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
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
class FixedSequence(SequentialHooks, Search):
    """Fixed-sequence testing upward from S starts, each chain at delta / S, stopping at its first failure.

    S = 1 is classic fixed-sequence testing; S > 1 starts chains at S equally spaced eligible candidates
    (LTT's multi-start: the candidate of rank floor(i·m / S) among the m eligible ones), so a bump in R(t) stops
    one chain, not the search.
    """

    n_starts: int = 1

    def level(self, delta: float, k: int) -> float:
        return delta / self.n_starts

    def default_n_min(self, bound: str, alpha: float, delta: float) -> int | None:
        return bounds.half_alpha_n(bound, alpha, self.level(delta, 1))

    def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
        return tuple(Chain(i, delta / self.n_starts) for i in range(self.n_starts))

    def entry_positions(self, chains: Sequence[Chain], eligible: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """By rank: chain i enters at the eligible candidate of rank floor(i·m / S)."""
        m = eligible.sum(axis=1)
        return np.stack([(c.first * m) // self.n_starts for c in chains]).reshape(len(chains), -1)


@dataclass(frozen=True)
class GeometricStarts(SequentialHooks, Search):
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

    def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
        if setting is None:
            raise ValueError(f"search = {self.name!r} needs the calibration setting")
        return tuple(Chain(first, gamma) for first, gamma in
                     geometric_chains(setting.n_calibration, setting.bound, setting.alpha, delta))


def lec_feasible(fd: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """LEC's condition on accepted counts: sum (E_i - alpha) <= -1, i.e. FD + 1 <= alpha·n (alpha·n is often an
    integer in exact arithmetic: a tolerance of 1e-9)."""
    return fd + 1 <= alpha * n + 1e-9


@dataclass(frozen=True)
class Marginal(Search):
    """LEC's rule (Wang et al., ICML 2026, arXiv 2512.01556): the largest candidate whose accepted calibration
    answers satisfy sum (E_i - alpha) <= -1, i.e. FD(t) + 1 <= alpha · n(t).

    Its guarantee is in expectation over calibration and test draw (P(error | accepted) <= alpha marginally,
    exchangeable data): a single calibration set's threshold can have R(t) > alpha far more often than delta —
    the split protocol's fdr_above_alpha column shows how often. Never a default and never served unless a
    person opts in (`cic.pipeline.gates.serving_state.guaranteed`); delta plays no part in it.
    """

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, errors: np.ndarray | None = None,
               setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        if counts is None or errors is None or setting is None:
            raise ValueError(f"search = {self.name!r} needs the accepted and error counts and the setting")
        ok = lec_feasible(np.broadcast_to(errors, eligible.shape), np.broadcast_to(counts, eligible.shape),
                          setting.alpha)
        return last_true(ok & eligible), np.full(eligible.shape[0], delta)

    def certificate(self, bound: str, n_errors: int, n_accepted: int, alpha: float, gamma: float) -> tuple[bool, str]:
        """LEC's own condition on the accepted counts (no bound, no level)."""
        excess = n_errors + 1 - alpha * n_accepted
        return excess <= 1e-9, f"errors + 1 - alpha·accepted = {excess:.4g} > 0"


@dataclass(frozen=True)
class Fallback(SequentialHooks, Search):
    """One fixed-sequence line through every candidate, entered at several points fixed before the labels, each
    with its own share of delta; a rejected hypothesis hands its whole level on to the next candidate (a
    graphical procedure whose graph is the line t_1 -> t_2 -> ...).

    Entry points (`fallback_entries`): the first count at which an empirical risk of alpha - min(alpha, 1 - alpha)/2
    certifies (`bounds.margin_n`: fixed_sequence's start for alpha <= 1/2, growing with alpha above; 0.6·delta),
    the geometric starts n/2, n/4, ... (0.1·delta) and an equal-count grid n·i/K (0.3·delta). The scan goes upward
    carrying a level: at an entry the entry's share is added; a candidate that passes at the carried level is
    rejected and the level moves on; one that fails keeps the level (it is stuck there) and the scan waits for
    the next entry. Where `geometric` runs the same kind of chains side by side (a union bound), here a chain
    that reaches the next entry adds that entry's level to its own. The grid entries are what a low-score
    region of confident-but-wrong answers cannot trap: every chain that starts inside it stops there, but some
    grid entry lies beyond it. FWER <= sum of the shares = delta (Bretz et al. 2009: weighted-Bonferroni
    graphical procedures control the FWER strongly under any dependence among the tests), conditionally on
    the scores like fixed_sequence. The shares are chosen by measurement: docs/statistics.md.
    """

    shares: tuple[float, ...] = (0.6, 0.1, 0.3)  # of delta: bottom entry, geometric starts, grid[, coarse grid]
    grid_entries: int = 20  # at most: grid entries at n·i/K, i = 1..K-1 (K adapted to n, `fallback_entries`)
    coarse_entries: int = 4  # at most, the coarse grid's K (with a fourth share)
    scaled: bool = True  # the bottom entry at `bounds.margin_n` (False: `half_alpha_n`; equal for alpha <= 1/2)

    def entries(self, setting: Setting, delta: float) -> tuple[tuple[int, float], ...]:
        return fallback_entries(setting.n_calibration, setting.bound, setting.alpha, delta, self.shares,
                                self.grid_entries, self.coarse_entries, self.scaled)

    def entries_on(self, setting: Setting, delta: float, counts: np.ndarray) -> tuple[tuple[int, float], ...]:
        """The entries on one calibration set's candidates (`counts`: their accepted counts, ascending), ties
        considered (`tied_entries`)."""
        return tied_entries(self.entries(setting, delta), counts, setting.bound, setting.alpha)

    ties_matter = True  # a tied block below an entry gets half its share (`tied_entries`)

    def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
        """The entries as segments of one line, each inheriting the level of a segment passed whole."""
        if setting is None:
            raise ValueError(f"search = {self.name!r} needs the calibration setting")
        entries = self.entries(setting, delta) if counts is None else self.entries_on(setting, delta, counts)
        return tuple(Chain(first, share, inherits=True, segment=True) for first, share in entries)


SEARCHES: Registry[Search] = Registry("search", (
    Fallback(
        "fallback", "fixed sequence, fallback entries",
        "FWER <= delta: one fixed-sequence line through every calibration score, entered at points fixed by "
        "(n, bound, alpha, delta) before the labels — the first count where an empirical risk of "
        "alpha - min(alpha, 1 - alpha)/2 can certify (0.6·delta), the geometric "
        "starts n/2, n/4, ... (0.1·delta) and an equal-count grid n·i/K, K <= 20 (0.3·delta) —; a threshold "
        "that passes hands its level on to the next score, so a chain reaching an entry adds that entry's level to "
        "its own (a graphical procedure, Bretz et al. 2009: the levels sum to delta). The largest threshold passed is "
        "returned. The guarantee holds conditionally on the scores whatever the shape of R(t); a low-score region "
        "of confident-but-wrong answers stops the chains that start inside it, not the grid entries beyond it",
        "high-probability", takes_grid=False, first_test=True,
        claim="P(R(t_hat) <= alpha) >= 1 - delta (a fixed-sequence line entered at 0.6·delta from the first "
              "certifiable count, 0.1·delta at n/2, n/4, ..., 0.3·delta at an equal-count grid; levels passed on)"),
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
    Marginal(
        "lec", "LEC (expectation)",
        "in expectation only (LEC, Wang et al. 2026): the largest calibration score whose accepted answers satisfy "
        "sum (E_i - alpha) <= -1; P(error | accepted) <= alpha on average over calibration sets (exchangeable "
        "data), not with probability 1 - delta for the calibration set at hand — the share of splits whose test "
        "FDR exceeds alpha (fdr_above_alpha) says how often one set's threshold misses",
        "expectation", short_guarantee="in expectation", takes_grid=False,
        claim="E-guarantee: P(error | accepted) <= alpha marginally over calibration sets (sum (E - alpha) <= -1)"),
    LargestFeasible(
        "paper", "paper (Algorithm 1)",
        "none simultaneous: every unique calibration score is tested at level delta with no multiplicity "
        "correction (Algorithm 1 as printed); Theorem 1 covers each fixed threshold, not the data-chosen "
        "maximum, whose violation rate can exceed delta (cic validity)",
        "none", short_guarantee="none simultaneous", takes_grid=False,
        claim="none for the chosen threshold: P(R(t) <= alpha) >= 1 - delta holds for each fixed t only"),
), hint="or multistart[S]", base=Search, group="cic.searches")
SEARCH_NAMES: tuple[str, ...] = SEARCHES.names(plugins=False)  # the built-in searches (plug-ins: SEARCHES.names())
DEFAULT_SEARCH = "fallback"  # why: docs/statistics.md, "The default search"

_MULTISTART = re.compile(r"^multistart\[(\d+)\]$")


def get_search(name: Any) -> Search:
    """The search object named `name` (a `Search` itself is returned as it is: a procedure of the caller's own);
    `multistart[S]` gives fixed-sequence testing from S starts."""
    if isinstance(name, Search):
        return name
    found = SEARCHES.find(name)
    if found is not None:
        return found
    match = _MULTISTART.match(name.strip().lower()) if isinstance(name, str) else None
    if match and int(match[1]) >= 1:
        s = int(match[1])
        base = SEARCHES["multistart"]
        return FixedSequence(f"multistart[{s}]", f"fixed sequence, {s} starts", base.guarantee.replace(
            "four fixed-sequence chains, each at level delta / 4", f"{s} fixed-sequence chains, each at level "
            f"delta / {s}"), "high-probability", first_test=True, n_starts=s,
            claim=base.claim.replace("4 fixed-sequence chains, each at delta / 4",
                                     f"{s} fixed-sequence chains, each at delta / {s}"))
    return SEARCHES.lookup(name)  # the one error text


def feasibility_table(bound: str, n_max: int, alpha: float, gamma: float) -> np.ndarray:
    """Largest feasible FD for every accepted count 0..n_max (the gather table of `feasibility`)."""
    return bounds.max_errors(bound, np.arange(int(n_max) + 1), alpha, gamma)


# ----------------------------------------------------------------------------------------------------------
# One search pipeline: candidates, the first test, eligibility and the selection, for calibrate, the split
# protocol and the simulator alike


def check_search_args(search: str | Search, grid: Any, n_min: Any, start: Any) -> tuple[np.ndarray | None, int | None,
                                                                                float | None]:
    """Validate the search-specific arguments against the search's registry entry (shared with the protocol)."""
    get_search(search).check_args(grid, n_min, start)
    grid_arr = as_grid(grid) if grid is not None else None
    n_min_v = check_positive_int(n_min, "n_min") if n_min is not None else None
    start_v = None
    if start is not None:
        start_v = float(start)
        if not math.isfinite(start_v):
            raise UserError(f"start = {start!r}: must be a finite threshold")
    return grid_arr, n_min_v, start_v


def compact_candidates(sorted_scores: np.ndarray, errors_through: np.ndarray, grid: np.ndarray | None = None,
                       start: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One calibration set's candidates, ascending, with n(t) and FD(t): the grid, else every distinct score plus
    `start` itself when it falls between scores (the start is the first hypothesis tested, even there).
    `errors_through[i]` counts the errors among the first i + 1 sorted scores."""
    if grid is not None:
        n = np.searchsorted(sorted_scores, grid, side="right").astype(np.int64)
        return grid, n, np.where(n > 0, errors_through[np.maximum(n - 1, 0)], 0)
    distinct = sorted_scores[1:] != sorted_scores[:-1]
    if distinct.all():  # no ties: every position is a candidate (skips three gathers)
        values, n, fd = sorted_scores, np.arange(1, sorted_scores.shape[0] + 1, dtype=np.int64), errors_through
    else:
        run_end = np.flatnonzero(np.append(distinct, True))
        values, n, fd = sorted_scores[run_end], run_end + 1, errors_through[run_end]
    if start is not None:
        at = int(np.searchsorted(values, start))
        if at == values.shape[0] or values[at] != start:
            n0 = int(np.searchsorted(sorted_scores, start, side="right"))
            values = np.insert(values, at, start)
            n, fd = np.insert(n, at, n0), np.insert(fd, at, errors_through[n0 - 1] if n0 else 0)
    return values, n, fd


def candidate_matrix(sorted_scores: np.ndarray, errors_through: np.ndarray, grid: np.ndarray | None = None,
                     start: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Many calibration sets of one size at once (rows, sorted ascending): (values, n, FD, candidate) of equal
    width — the grid, else every position with `candidate` marking the last of each run of equal scores, plus a
    first column for `start` (a candidate unless it equals a score of that row). The same candidates per row
    as `compact_candidates`."""
    rows = np.arange(sorted_scores.shape[0])[:, None]

    def at(thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = np.stack([np.searchsorted(row, thresholds, side="right") for row in sorted_scores]).astype(np.int64)
        return n, np.where(n > 0, errors_through[rows, np.maximum(n - 1, 0)], 0)

    if grid is not None:
        n, fd = at(grid)
        return np.broadcast_to(grid, n.shape), n, fd, np.ones(n.shape, dtype=bool)
    values, fd = sorted_scores, errors_through
    n = np.broadcast_to(np.arange(1, sorted_scores.shape[1] + 1, dtype=np.int64), sorted_scores.shape)
    candidate = np.concatenate([sorted_scores[:, 1:] != sorted_scores[:, :-1],
                                np.ones((sorted_scores.shape[0], 1), dtype=bool)], axis=1)
    if start is not None:
        n0, fd0 = at(np.array([start]))
        values = np.concatenate([np.full((sorted_scores.shape[0], 1), start), sorted_scores], axis=1)
        n, fd = np.concatenate([n0, n], axis=1), np.concatenate([fd0, fd], axis=1)
        candidate = np.concatenate([~(sorted_scores == start).any(axis=1, keepdims=True), candidate], axis=1)
    return values, n, fd, candidate


@dataclass(frozen=True)
class SearchOutcome:
    """What a search chose, per calibration set: the candidate index (-1: alpha unattainable) and the level its
    certificate holds at; the first accepted count tested (n_min as resolved) and, on the single-set fast paths,
    how many exact tests ran."""

    index: np.ndarray
    level: np.ndarray
    n_min: int | None
    n_tested: int | None


def run_search(search: Search, values: np.ndarray, n: np.ndarray, fd: np.ndarray, *, setting: Setting,
               delta: float, n_min: int | None = None, start: float | None = None,
               candidate: np.ndarray | None = None, k: int | None = None,
               table: FeasibilityTables | None = None, lazy: bool = False,
               oracle: FeasibleAt | None = None) -> SearchOutcome:
    """Run `search` on candidates (one row per calibration set, or a 1-D single set): resolve its first test
    (`n_min`, `start`, else the search's default), mark the eligible candidates and select.

    `k` is the family size the level divides by (default: the number of columns); `table` the largest feasible FD
    per accepted count and level, over the spans asked for (default: kept for this call only, up to the largest
    count; a caller running many calibration sets of one size passes one to share). `lazy` runs a single
    set through the search's exact fast path where it has one (few exact tests on a million candidates).
    `oracle` replaces the binomial tests by a feasibility oracle of the caller's (`cic.stats.judged`: judge labels
    corrected by people's); the candidates, entries and levels are the same.
    """
    values, n, fd = np.atleast_2d(values), np.atleast_2d(n), np.atleast_2d(fd)
    k = int(values.shape[1]) if k is None else int(k)
    eligible = np.ones(values.shape, dtype=bool) if candidate is None else np.atleast_2d(candidate).copy()
    if search.first_test:
        if n_min is None and start is None:
            n_min = search.default_n_min(setting.bound, setting.alpha, delta)
        if n_min is not None:
            eligible &= n >= n_min
        if start is not None:
            eligible &= values >= start
    unattained = search.level(delta, k)
    if lazy and values.shape[0] == 1 and oracle is None:
        scanned = search.scan_one(fd[0], n[0], eligible[0], delta=delta, k=k, setting=setting)
        if scanned is not None:
            index, level, tested = scanned
            return SearchOutcome(np.array([index]), np.array([level if index >= 0 else unattained]), n_min, tested)
    if table is None:
        table = FeasibilityTables(setting.bound, setting.alpha, int(n.max(initial=0)))
    first = int(n_min) if search.first_test and n_min is not None and start is None else 0
    if oracle is None:
        oracle = feasibility_oracle(table, n, fd, first)
    index, level = search.select(eligible, oracle, delta, k, counts=n, errors=fd, setting=setting)
    return SearchOutcome(index, np.where(index >= 0, level, unattained), n_min, None)


# ----------------------------------------------------------------------------------------------------------
# Exact scans of one calibration set (the lazy fast paths)


def _last_true(mask: np.ndarray) -> int:
    return int(mask.shape[0] - 1 - np.argmax(mask[::-1])) if mask.any() else -1


def _feasible_chunk(bound: str, fd: np.ndarray, n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    """Exact feasibility of a run of candidates; through the max-FD table when its n-range is narrow."""
    if bounds.get_bound(bound).table_is_cheap and alpha * (n[-1] - n[0]) < 0.25 * n.shape[0]:
        return fd <= bounds.max_errors(bound, n, alpha, gamma)
    return np.asarray(bounds.feasible(bound, fd, n, alpha, gamma), dtype=bool)


def search_paper(fd: np.ndarray, n: np.ndarray, *, bound: str, alpha: float, gamma: float) -> int:
    """Algorithm 1 as printed: the largest candidate whose UCB at level gamma (= delta) is <= alpha.

    Guarantee carried: Theorem 1 for any *fixed* threshold. Not carried: the data-chosen maximum over all
    unique calibration scores is not covered by a simultaneous guarantee; its violation rate can exceed delta
    (see `cic.simulate`). Skips candidates failing the cheap necessary condition FD <= alpha · n, then
    scans the rest from the largest downwards in growing chunks and stops at the first chunk holding a
    feasible candidate, so typical calls evaluate the exact test on a small part of the candidates.
    """
    maybe = np.flatnonzero(bounds.might_be_feasible(bound, fd, n, alpha, gamma))
    hi, chunk = maybe.shape[0], 4096
    while hi > 0:
        part = maybe[max(0, hi - chunk):hi]
        last = _last_true(_feasible_chunk(bound, fd[part], n[part], alpha, gamma))
        if last >= 0:
            return int(part[last])
        hi, chunk = hi - part.shape[0], chunk * 2
    return -1
