"""One loop for every sequential search: a search is its chains, and the three ways to run it are written here once.

A chain enters the line of candidates (ascending thresholds) at a point fixed before the labels, tests upward at
its level and stops at its first failure. A search's hooks say where its chains enter and what each brings:

    chains(setting, delta, counts)  start: each chain's first accepted count (or rank) and share of delta
    entry_positions(...)            next hypothesis: where, among the eligible candidates, each chain enters
    Chain.share, Chain.inherits     local level: the chain's share, plus the level the chain before it hands on
                                    when that chain passed its whole segment (a graphical line, Bretz et al. 2009)
    Chain.segment                   update: a segment chain stops where the next chain enters and, having passed
                                    every candidate there, hands its level on; otherwise a chain runs to the end

The candidate returned is the highest any chain passed, with the level it passed at. The three paths: many
calibration sets at once through feasibility tables (`select`, the split protocol and the simulator), one set
through the tables in chunks (`select` on one row: a million candidates, only the tested ones read), and one set
by lazy exact tests (`scan_one`, `cic.calibrate`). `tests/stats/test_sequential.py` holds them equal on every
sequential search, and to the literal procedures in `tests/support/reference.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.stats import bounds

FeasibleAt = Callable[..., np.ndarray]
SCAN_CHUNK = 1 << 14  # candidates a one-set scan reads at a time before it looks for the first failure


@dataclass(frozen=True)
class Setting:
    """What a search may know besides the counts: the calibration size, the bound and alpha (never labels)."""

    n_calibration: int
    bound: str
    alpha: float


@dataclass(frozen=True)
class Chain:
    """One chain of a sequential search: where it enters (`first`: an accepted count, or a rank among eligible
    candidates for a search whose `entry_positions` says so), its share of delta, whether it takes the level the
    chain before it hands on, and whether it is a segment (stops where the next chain enters)."""

    first: int
    share: float
    inherits: bool = False
    segment: bool = False


class SequentialHooks:
    """The hooks a sequential search implements (mixed into `cic.stats.searches.Search` subclasses) and the three
    execution paths generated from them."""

    name: str
    ties_matter: bool = False  # chains depend on the set's own counts (ties): sets may differ from one another

    def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
        """The chains, in the order they run (segment chains ascending); `counts`: one set's eligible accepted
        counts (ascending), for searches whose chains depend on ties (`ties_matter`), else None."""
        raise NotImplementedError

    def entry_positions(self, chains: Sequence[Chain], eligible: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """Per chain and row, its entry's position among the row's eligible candidates: the number of eligible
        candidates with fewer accepted answers than its `first`."""
        if counts is None:
            raise ValueError(f"search = {self.name!r} needs the accepted counts")
        counts = np.broadcast_to(counts, eligible.shape)
        return np.stack([(eligible & (counts < c.first)).sum(axis=1) for c in chains]).reshape(len(chains), -1)

    # -- the three paths ------------------------------------------------------------------------------------

    def select(self, eligible: np.ndarray, feasible_at: FeasibleAt, delta: float, k: int, *,
               counts: np.ndarray | None = None, errors: np.ndarray | None = None,
               setting: Setting | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the chosen column (-1: none) and its level, through the feasibility tables."""
        plain = self.chains(setting, delta)
        rows = eligible.shape[0]
        own = None
        if self.ties_matter and counts is not None:
            per_row = np.broadcast_to(counts, eligible.shape)
            own = [self.chains(setting, delta, per_row[r][eligible[r]]) for r in range(rows)]
        if rows == 1 or (own is not None and any(chains != plain for chains in own)):  # one set at a time
            picks = [self._select_one(eligible[r], lambda g, cols=None, r=r: _row_of(feasible_at, g, cols, r),
                                      None if counts is None else np.broadcast_to(counts, eligible.shape)[r],
                                      own[r] if own is not None else plain) for r in range(rows)]
            return np.concatenate([b for b, _ in picks]), np.concatenate([lv for _, lv in picks])
        return self._select_rows(eligible, feasible_at, counts, plain)

    def _select_rows(self, eligible: np.ndarray, feasible_at: FeasibleAt, counts: np.ndarray | None,
                     chains: tuple[Chain, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Every row at once; rows whose carried levels differ are tested at their own level."""
        rows, cols = eligible.shape
        row, col = np.arange(rows), np.arange(cols)
        starts = _columns_at(eligible, self.entry_positions(chains, eligible, counts))
        last_eligible = np.maximum.accumulate(np.where(eligible, col[None, :], -1), axis=1)
        best, level, carry = np.full(rows, -1, dtype=np.int64), np.full(rows, np.nan), np.zeros(rows)
        tables: dict[float, np.ndarray] = {}
        for e, chain in enumerate(chains):
            start = starts[e]
            stop = starts[e + 1] if chain.segment and e + 1 < len(chains) else np.full(rows, cols)
            held = np.full(rows, chain.share) + (carry if chain.inherits else 0.0)
            fail_at = np.full(rows, cols)
            lo, hi = int(start.min()), int(stop.max())  # only these columns are tested
            for w in (np.unique(held) if lo < hi else ()):
                these = held == w
                if w not in tables:
                    tables[w] = feasible_at(float(w))
                window = slice(lo, hi)
                failed = (eligible[these, window] & ~tables[w][these, window]
                          & (col[None, window] >= start[these, None]))
                fail_at[these] = np.where(failed.any(axis=1), lo + np.argmax(failed, axis=1), cols)
            end = np.minimum(fail_at, stop)  # the chain passes [start, end)
            reached = np.where(end > start, last_eligible[row, np.maximum(end - 1, 0)], -1)
            better = reached > best
            best, level = np.where(better, reached, best), np.where(better, held, level)
            carry = np.where(fail_at >= stop, held, 0.0)  # passed its whole segment: its level moves on
        return best, level

    def _select_one(self, eligible: np.ndarray, feasible_at: FeasibleAt, counts: np.ndarray | None,
                    chains: tuple[Chain, ...]) -> tuple[np.ndarray, np.ndarray]:
        """One set through the tables: each chain read in chunks up to its first failure (on millions of
        candidates the feasibility of the counts past it is never needed)."""
        idx = np.flatnonzero(eligible)
        at = self.entry_positions(chains, eligible[None, :], None if counts is None else counts[None, :])[:, 0]
        best, level, carry = -1, math.nan, 0.0
        for e, chain in enumerate(chains):
            a = int(at[e])
            b = int(at[e + 1]) if chain.segment and e + 1 < len(chains) else idx.shape[0]
            held = chain.share + (carry if chain.inherits else 0.0)
            passed = 0
            for c0 in range(a, b, SCAN_CHUNK):
                ok = feasible_at(held, idx[c0:min(c0 + SCAN_CHUNK, b)])[0]
                if not ok.all():
                    passed += int(np.argmin(ok))
                    break
                passed += ok.shape[0]
            if passed > 0 and idx[a + passed - 1] > best:
                best, level = int(idx[a + passed - 1]), held
            carry = held if passed >= b - a else 0.0  # an empty segment passes its level on too
        return np.array([best]), np.array([level])

    def scan_one(self, fd: np.ndarray, n: np.ndarray, eligible: np.ndarray, *, delta: float, k: int,
                 setting: Setting) -> tuple[int, float, int | None] | None:
        """One set by exact tests, each chain scanned lazily from its entry to its first failure: (chosen index
        or -1, its level, exact tests run)."""
        chains = self.chains(setting, delta, n[eligible] if self.ties_matter else None)
        idx = np.flatnonzero(eligible)
        at = self.entry_positions(chains, eligible[None, :], n[None, :])[:, 0]
        best, level, tested, carry = -1, math.nan, 0, 0.0
        for e, chain in enumerate(chains):
            a = int(at[e])
            b = int(at[e + 1]) if chain.segment and e + 1 < len(chains) else idx.shape[0]
            held = chain.share + (carry if chain.inherits else 0.0)
            segment = np.zeros(eligible.shape, dtype=bool)
            segment[idx[a:b]] = True
            end, count = search_fixed_sequence(fd, n, segment, bound=setting.bound, alpha=setting.alpha, gamma=held)
            tested += count
            if end > best:
                best, level = end, held
            carry = held if end == (int(idx[b - 1]) if b > a else -1) else 0.0
        return best, level, tested


def _columns_at(eligible: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per chain and row, the column of the eligible candidate at that position (the row's width where none)."""
    rows, cols = eligible.shape
    rank = np.cumsum(eligible, axis=1) - 1
    out = np.full(positions.shape, cols, dtype=np.int64)
    total = eligible.sum(axis=1)
    for e in range(positions.shape[0]):
        p = positions[e]
        inside = p < total
        hit = eligible & (rank == p[:, None])
        out[e] = np.where(inside, np.argmax(hit, axis=1), cols)
    return out


def _row_of(feasible_at: FeasibleAt, gamma: float, cols: Any, row: int) -> np.ndarray:
    """Row `row` of a feasibility table over every calibration set (as a table of one set: shape (1, ...))."""
    table = feasible_at(gamma) if cols is None else feasible_at(gamma, cols)
    return table[row:row + 1] if table.shape[0] > 1 else table


def search_fixed_sequence(fd: np.ndarray, n: np.ndarray, eligible: np.ndarray, *, bound: str, alpha: float,
                          gamma: float) -> tuple[int, int]:
    """Test eligible candidates upwards at level gamma = delta, stop at the first failure; return (index, tests).

    Guarantee carried: fixed-sequence testing controls the family-wise error of the hypotheses
    H_t: R(t) > alpha at delta, whatever the shape of R(t) (Learn-then-Test, Angelopoulos et al. 2021), so
    P(R(t_hat) > alpha) <= delta. The candidates are the calibration scores themselves (or a grid): the
    sequence, and the first test (a `start` threshold, or the n_min-th smallest score), depend on the scores
    and never on the labels, so the guarantee holds conditionally on the scores — given the scores, the errors
    are independent draws and the ordering is fixed. With a grid and a start fixed in advance it holds
    unconditionally. Not carried: power when R(t) is far from monotone — the search stops at the first
    failure, even if larger thresholds would pass (`multistart` restarts further up).
    """
    idx = np.flatnonzero(eligible)
    tested, chunk, pos = 0, 256, 0
    last_ok = -1
    while pos < idx.shape[0]:
        part = idx[pos:pos + chunk]
        ok = np.asarray(bounds.feasible(bound, fd[part], n[part], alpha, gamma), dtype=bool)
        if not ok.all():
            first_fail = int(np.argmin(ok))
            tested += first_fail + 1
            return (int(part[first_fail - 1]) if first_fail > 0 else last_ok), tested
        tested += part.shape[0]
        last_ok = int(part[-1])
        pos, chunk = pos + chunk, chunk * 2
    return last_ok, tested
