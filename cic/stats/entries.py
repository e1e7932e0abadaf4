"""Where a sequential search's chains enter, fixed before the labels: the geometric starts (n/2, n/4, ... with
harmonic shares beside a bottom chain), the fallback line's entries (a bottom entry, geometric starts, an
equal-count grid, optionally a coarse one) and how tied scores shift them. Functions of (n, bound, alpha, delta)
and the scores' counts alone; `cic.stats.searches` turns them into chains."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from cic.errors import UserError
from cic.stats import bounds

BOTTOM_SHARE = 0.9  # of delta, for the chain from the first count that can certify (the rest: geometric starts)


@functools.lru_cache(maxsize=4096)
def geometric_chains(n_calibration: int, bound: str, alpha: float, delta: float,
                     bottom: float | None = None, scaled: bool = False) -> tuple[tuple[int, float], ...]:
    """The (first accepted count, level) of each chain of the geometric search.

    A bottom chain at delta·BOTTOM_SHARE from `half_alpha_n` (fixed_sequence's first test at its level: where a
    small certifiable region lies), then chains from ceil(n / 2^k), k = 1..J, sharing the rest as rest·(1/k)/H_J,
    J the most chains whose last one starts where its own level can certify an empirical risk of alpha/2
    (`scaled`: of `bounds.margin_rate(alpha)`, the same below alpha = 1/2).
    """
    floor_of = bounds.margin_n if scaled else bounds.half_alpha_n
    bottom = delta * BOTTOM_SHARE if bottom is None else bottom
    rest = delta - bottom
    chains: tuple[tuple[int, float], ...] = ()
    harmonic = 0.0
    for j in range(1, 64):
        harmonic += 1.0 / j
        first = -(-n_calibration // 2**j)
        if first < 1 or first < floor_of(bound, alpha, rest / (j * harmonic)):
            break
        chains = tuple((-(-n_calibration // 2**i), rest / (i * harmonic)) for i in range(1, j + 1))
    if not chains:  # too few answers for any geometric chain: the bottom chain alone, at delta
        return ((floor_of(bound, alpha, delta), delta),)
    return ((floor_of(bound, alpha, bottom), bottom), *chains)


def tied_entries(entries: tuple[tuple[int, float], ...], counts: np.ndarray, bound: str,
                 alpha: float) -> tuple[tuple[int, float], ...]:
    """`entries` on candidates whose accepted counts are `counts` (ascending). With continuous scores every count is
    a candidate's and nothing changes. Where tied scores leave no candidate at an entry's count, the tied block just
    below it would never be tested (the entry starts past it): the entry's share is then split in half between that
    block and the entry's own start, when the block can certify on its half with no error. A rejected block hands
    its level on to the entry's start, so nothing is lost when it passes and at most half the entry's level when it
    fails. The shares still sum to delta and depend on the scores alone, not the labels: the procedure is still a
    graphical one fixed before the labels (FWER <= delta conditionally on the scores)."""
    counts = np.asarray(counts)
    if counts.size == 0:
        return entries
    out: dict[int, float] = {}
    for count, share in entries:
        at = int(np.searchsorted(counts, count, side="left"))
        if at > 0 and (at == counts.size or counts[at] != count):
            below = int(counts[at - 1])
            if below >= _certifiable_from(bound, alpha, share / 2):
                out[below] = out.get(below, 0.0) + share / 2
                share /= 2
        out[count] = out.get(count, 0.0) + share
    return tuple(sorted(out.items()))


_certifiable_from = functools.lru_cache(maxsize=4096)(bounds.min_certifiable_n)


@functools.lru_cache(maxsize=4096)
def fallback_entries(n_calibration: int, bound: str, alpha: float, delta: float,
                     shares: tuple[float, ...] = (0.6, 0.1, 0.3), grid_entries: int = 20, coarse_entries: int = 4,
                     scaled: bool = True) -> tuple[tuple[int, float], ...]:
    """The (first accepted count, share of delta) of each entry of the fallback search, ascending by count,
    shares at equal counts summed; they sum to delta at most.

    The bottom entry at `bounds.margin_n` (`half_alpha_n` when not `scaled`; the same for alpha <= 1/2) with
    shares[0]·delta; the geometric starts ceil(n / 2^j) sharing shares[1]·delta as `geometric_chains` does; grid
    entries ceil(n·i/K) sharing shares[2]·delta equally, K the largest K <= grid_entries whose middle entry (n/2)
    can certify on its own share (small n: a coarse grid with larger shares), each entry kept only where its share
    can; with a fourth share, a coarse grid ceil(n·i/coarse_entries) sharing it the same way. A share no entry can
    use is given to the bottom entry. A function of (n, bound, alpha, delta) alone.
    """
    if len(shares) not in (3, 4) or min(shares) < 0 or sum(shares) > 1.0 + 1e-9:
        raise UserError(f"fallback shares = {shares!r}: three or four non-negative shares of delta, 1 in all at most")
    floor_of = bounds.margin_n if scaled else bounds.half_alpha_n
    bottom_share, geometric_share, *grid_shares = (delta * s for s in shares)
    geometric = geometric_chains(n_calibration, bound, alpha, delta, bottom=delta - geometric_share,
                                 scaled=scaled)[1:]
    grids = [_grid_entries(n_calibration, bound, alpha, share, k, floor_of)
             for share, k in zip(grid_shares, (grid_entries, coarse_entries), strict=False)]
    entries = [*geometric, *(entry for grid in grids for entry in grid)]
    bottom = delta - sum(w for _, w in entries)
    merged: dict[int, float] = {}
    for count, share in ((floor_of(bound, alpha, bottom), bottom), *entries):
        merged[count] = merged.get(count, 0.0) + share
    return tuple(sorted(merged.items()))


def _grid_entries(n_calibration: int, bound: str, alpha: float, share: float, most: int,
                  floor_of: Callable[[str, float, float], int]) -> list[tuple[int, float]]:
    """Entries ceil(n·i/K), i = 1..K-1, sharing `share` equally: K the largest K <= most whose middle entry (n/2)
    can certify on its own share, each entry kept only where its share can (none: [])."""
    for k in range(most, 1, -1):
        each = share / (k - 1)
        floor = floor_of(bound, alpha, each)
        if -(-n_calibration // 2) >= floor:
            return [(c, each) for i in range(1, k) if (c := -(-n_calibration * i // k)) >= floor]
    return []
