"""The paper's evaluation protocol: repeated random calibration/test splits, FDR and power per (alpha, bound).

For each split, calibrate on the calibration part and measure on the test part: test FDR (errors among
accepted), `coverage` = accepted / test size (the paper's power) and `correct_coverage` = accepted-and-correct
/ correct (COIN's power). A split with no certified threshold counts in `fails` and abstains on everything
(coverage 0); FDR statistics are over the splits that found a threshold.

The data are sorted once; each split is a boolean mask over the sorted order, drawn row by row (the same
rows `split_masks` returns), so memory stays O(items). Within a split every candidate's n(t) and FD(t) come
from one cumulative sum, and feasibility is one gather from the bound's table of largest feasible error
counts, built once per (bound, alpha, level) for the calibration size and shared by every split: a split
costs about as much as sorting it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats import searches
from cic.stats._validation import as_pair, check_open_unit, check_positive_int, checked
from cic.stats.searches import (
    DEFAULT_SEARCH,
    Search,
    Setting,
    check_search_args,
    compact_candidates,
    get_search,
    run_search,
)

if TYPE_CHECKING:
    import polars as pl

DEFAULT_ALPHAS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.25)

#: Largest number of (split × item) cells held at once; splits are processed in blocks below this.
_BLOCK_CELLS = 4_000_000


def calibration_size(n_items: int, cal_fraction: float) -> int:
    """floor(cal_fraction × n_items + 1/2): halves round up whatever their parity; refused when a side is empty.

    (Python's round() sends halves to the even neighbour, so 0.5 × 5 and 0.5 × 7 would round in opposite
    directions.) A tiny tolerance keeps products such as 0.3 × 5 = 1.4999999999999998 on the intended side.

    >>> calibration_size(5, 0.5), calibration_size(7, 0.5), calibration_size(10, 0.3)
    (3, 4, 3)
    """
    cal_fraction = check_open_unit(cal_fraction, "cal_fraction")
    n_cal = int(math.floor(cal_fraction * n_items + 0.5 + 1e-9))
    if n_cal < 1:
        raise UserError(f"cal_fraction = {cal_fraction!r} with {n_items} items leaves a calibration set of "
                         "size 0")
    if n_cal > n_items - 1:
        raise UserError(f"cal_fraction = {cal_fraction!r} with {n_items} items leaves a test set of size 0")
    return n_cal


def split_masks(n_items: int, n_splits: int, cal_fraction: float, seed: int = 0) -> np.ndarray:
    """Boolean (n_splits, n_items) matrix; True marks the calibration items of each split.

    Parameters
    ----------
    n_items : int
        Size of the labelled table.
    n_splits : int
        Number of random splits.
    cal_fraction : float
        Share of items in the calibration part; its size is `calibration_size(n_items, cal_fraction)`.
    seed : int
        The same seed gives the same splits, so other tools can reproduce the protocol item by item.

    Returns
    -------
    numpy.ndarray
        Each row holds exactly calibration_size True values in uniformly random positions.

    Examples
    --------
    >>> masks = split_masks(10, 3, 0.5, seed=0)
    >>> masks.shape, masks.sum(axis=1).tolist()
    ((3, 10), [5, 5, 5])
    """
    n_splits = check_positive_int(n_splits, "n_splits")
    return np.stack(list(iter_split_masks(n_items, n_splits, cal_fraction, seed)))


def iter_split_masks(n_items: int, n_splits: int, cal_fraction: float, seed: int = 0) -> Iterator[np.ndarray]:
    """The rows of `split_masks`, one at a time (same seed, same rows; O(n_items) memory)."""
    n_cal = calibration_size(n_items, cal_fraction)
    base = np.zeros(n_items, dtype=bool)
    base[:n_cal] = True
    rng = np.random.default_rng(seed)
    for _ in range(n_splits):
        yield rng.permuted(base)


def gather(cum: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """cum[:, pos] with 0 where pos = -1 (nothing at or below the threshold)."""
    out = cum[:, np.maximum(pos, 0)]
    out[:, pos < 0] = 0
    return out


@dataclass(frozen=True)
class SplitBlock:
    """Cumulative counts over the sorted items for a block of splits (one row per split).

    cum_n / cum_fd: calibration items / calibration errors at sorted positions <= j; cum_tn / cum_tfd: the
    same for the test part; test_correct: correct test items per split. `first` is the block's first split.
    """

    first: int
    cal: np.ndarray
    cum_n: np.ndarray
    cum_fd: np.ndarray
    cum_tn: np.ndarray
    cum_tfd: np.ndarray
    test_correct: np.ndarray


@dataclass(frozen=True)
class SortedSplits:
    """The data sorted once by score, with every split's calibration mask (from `split_masks`) in that order.

    Used by the baselines (`cic.stats.baselines`); its masks are `split_masks`, the rows the protocol draws one by
    one, so every method sees exactly the same splits.
    """

    scores: np.ndarray  # ascending
    errors: np.ndarray  # bool, in the same order
    masks: np.ndarray  # (n_splits, n_items) calibration masks over the sorted order
    n_cal: int
    n_test: int

    @classmethod
    def build(cls, scores: np.ndarray, errors: np.ndarray, n_splits: int, cal_fraction: float,
              seed: int) -> SortedSplits:
        masks = split_masks(scores.shape[0], n_splits, cal_fraction, seed)
        n_cal = int(masks[0].sum())
        order = np.argsort(scores, kind="stable")
        return cls(scores[order], errors[order].astype(bool), masks[:, order], n_cal, scores.shape[0] - n_cal)

    @property
    def n_splits(self) -> int:
        return int(self.masks.shape[0])

    def unique_positions(self) -> np.ndarray:
        """The last sorted position of each distinct score: where a threshold at that score stops accepting."""
        return np.flatnonzero(np.append(self.scores[1:] != self.scores[:-1], True))

    def run_ends(self) -> np.ndarray:
        """For each sorted position, the last position holding the same score (a threshold accepts ties)."""
        ends = self.unique_positions()
        return np.repeat(ends, np.diff(np.concatenate([[-1], ends])))

    def blocks(self) -> Iterator[SplitBlock]:
        """Cumulative counts for blocks of splits, each block below `_BLOCK_CELLS` (split x item) cells."""
        n_items = self.scores.shape[0]
        all_n = np.arange(1, n_items + 1)
        all_fd = np.cumsum(self.errors)
        block = max(1, _BLOCK_CELLS // n_items)
        for b0 in range(0, self.n_splits, block):
            cal = self.masks[b0:b0 + block]
            cum_n = np.cumsum(cal, axis=1, dtype=np.int64)
            cum_fd = np.cumsum(cal & self.errors, axis=1, dtype=np.int64)
            cum_tn, cum_tfd = all_n - cum_n, all_fd - cum_fd
            yield SplitBlock(b0, cal, cum_n, cum_fd, cum_tn, cum_tfd, self.n_test - cum_tfd[:, -1])


def split_measures(found: np.ndarray, accepted: np.ndarray, wrong: np.ndarray, test_correct: np.ndarray,
                  n_test: int) -> dict[str, np.ndarray]:
    """Per split: test FDR (NaN on a fail; 0 when nothing was accepted), coverage and correct coverage."""
    with np.errstate(invalid="ignore", divide="ignore"):
        fdr = np.where(accepted > 0, wrong / np.maximum(accepted, 1), 0.0)
        correct_cov = np.where(test_correct > 0, (accepted - wrong) / np.maximum(test_correct, 1), np.nan)
    return {"fdr": np.where(found, fdr, np.nan), "coverage": accepted / n_test, "correct_coverage": correct_cov}


#: The columns of `evaluate_splits`' table, in order, with their polars types (the stored `evaluations` rows hold
#: the same columns, so a report renders from either).
SPLIT_TABLE: dict[str, str] = {
    "alpha": "Float64", "bound": "String", "search": "String", "delta": "Float64", "fdr_mean": "Float64",
    "fdr_std": "Float64", "fdr_above_alpha": "Float64", "coverage_mean": "Float64", "coverage_std": "Float64",
    "correct_coverage_mean": "Float64", "correct_coverage_std": "Float64", "fails": "Int64", "n_splits": "Int64",
    "base_error_rate": "Float64", "threshold_mean": "Float64", "threshold_std": "Float64", "n_cal": "Int64",
    "n_test": "Int64", "score_limit": "Float64", "ceiling": "Float64"}


def _as_names(value: Any, name: str) -> list[str]:
    items = [value] if isinstance(value, str | Search) else list(value)
    if not items:
        raise UserError(f"{name} is empty: give at least one")
    return items


@dataclass
class _SearchPlan:
    """One search's fixed settings in the protocol: grid, n_min, start."""

    search: Search
    grid: np.ndarray | None
    n_min: int | None
    start: float | None


@checked
def _iter_outcomes(scores: Any, errors: Any, *, alphas: Sequence[float], bounds: Sequence[str] | str,
                   search: Sequence[str] | str, delta: float, n_splits: int, cal_fraction: float, seed: int,
                   grid: Any, n_min: int | None, start: float | None,
                   progress: Callable[[int, int], None] | None = None
                   ) -> Iterator[tuple[float, str, str, dict[str, np.ndarray]]]:
    s, e = as_pair(scores, errors)
    alpha_list = list(alphas)  # checked from the declaration (`checked`)
    steps = n_splits * len(_as_names(search, "search")) * len(_as_names(bounds, "bounds")) * len(alpha_list)
    if progress is not None:
        progress(0, steps)  # before the sort: 10^7 pairs take seconds before the first search
    bound_list = [_bounds.resolve_bound(b) for b in _as_names(bounds, "bounds")]
    plans: dict[str, _SearchPlan] = {}
    for name in _as_names(search, "search"):
        found = get_search(name)
        first = found.first_test
        g, m, st = check_search_args(name, grid if found.takes_grid else None, n_min if first else None,
                                     start if first else None)
        plans[found.name] = _SearchPlan(found, g, m, st)

    order = np.argsort(s, kind="stable")
    sorted_scores, sorted_errors = s[order], e[order].astype(bool)
    n_items = s.shape[0]
    n_cal = calibration_size(n_items, cal_fraction)
    n_test = n_items - n_cal
    errors_through = np.cumsum(sorted_errors, dtype=np.int64)  # all items, sorted order
    base_error = float(e.mean())
    tables = {(b, a): searches.FeasibilityTables(b, a, n_cal) for b in bound_list for a in alpha_list}  # all splits

    keys = [(a, b, name) for name in plans for b in bound_list for a in alpha_list]
    done = 0
    out = {key: {f: np.zeros(n_splits, dtype=dt) for f, dt in _OUTCOME_FIELDS.items()} for key in keys}
    for split, mask in enumerate(iter_split_masks(n_items, n_splits, cal_fraction, seed)):
        cal_pos = np.flatnonzero(mask[order])  # sorted positions of the calibration items
        cal_scores = sorted_scores[cal_pos]
        cum_errors = np.cumsum(sorted_errors[cal_pos], dtype=np.int64)
        test_correct = n_test - (int(errors_through[-1]) - int(cum_errors[-1]))
        for name, plan in plans.items():
            values, n, fd = compact_candidates(cal_scores, cum_errors, plan.grid, plan.start)
            # test items a threshold accepts: every item <= it, minus the calibration ones
            accepted_all = np.searchsorted(sorted_scores, values, side="right")
            t_acc = accepted_all - n
            t_fd = np.where(accepted_all > 0, errors_through[np.maximum(accepted_all - 1, 0)], 0) - fd
            for bound in bound_list:
                for alpha in alpha_list:
                    idx = int(run_search(plan.search, values, n, fd, setting=Setting(n_cal, bound, alpha),
                                         delta=delta, n_min=plan.n_min, start=plan.start,
                                         table=tables[(bound, alpha)]).index[0])
                    row = out[(alpha, bound, name)]
                    if idx >= 0:
                        row["found"][split] = True
                        row["threshold"][split] = values[idx]
                        row["cal_accepted"][split], row["cal_errors"][split] = n[idx], fd[idx]
                        row["test_accepted"][split], row["test_errors"][split] = t_acc[idx], t_fd[idx]
                    else:
                        row["threshold"][split] = np.nan
                    row["test_correct"][split] = test_correct
                    done += 1
                    if progress is not None:
                        progress(done, steps)
    for key in keys:
        row = out[key]
        correct = row.pop("test_correct")
        row.update(split_measures(row["found"], row["test_accepted"], row["test_errors"], correct, n_test))
        row["n_cal"] = np.full(n_splits, n_cal)
        row["n_test"] = np.full(n_splits, n_test)
        row["base_error_rate"] = np.full(n_splits, base_error)
        alpha, bound, name = key
        yield alpha, bound, name, row


_OUTCOME_FIELDS = {"found": bool, "threshold": np.float64, "cal_accepted": np.int64, "cal_errors": np.int64,
                   "test_accepted": np.int64, "test_errors": np.int64, "test_correct": np.int64}


def split_outcomes(scores: Any, errors: Any, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                   bounds: Sequence[str] | str = ("hoeffding", "cp"), search: Sequence[str] | str = DEFAULT_SEARCH,
                   delta: float = 0.05, n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                   grid: Any = None, n_min: int | None = None, start: float | None = None) -> pl.DataFrame:
    """One row per (alpha, bound, search, split): threshold (null on a fail), test FDR, coverage, counts.

    Parameters
    ----------
    scores, errors : array_like
        The labelled table: uncertainty (lower = surer) and 1 where the answer is wrong.
    alphas : sequence of float
        Risk levels.
    bounds, search : str or sequence of str
        Names from the bound and search registries (the paper's tables use search "paper").
    delta, n_splits, cal_fraction, seed
        Confidence, number of random splits, calibration share, and the seed of `split_masks`.
    grid, n_min, start
        Search arguments for the searches that take them (fixed in advance).

    Returns
    -------
    polars.DataFrame
        Columns alpha, bound, search, split, found, threshold, cal_accepted, cal_errors, test_accepted,
        test_errors, fdr, coverage, correct_coverage, n_cal, n_test, base_error_rate.

    Examples
    --------
    >>> import numpy as np
    >>> rows = split_outcomes(np.linspace(0, 1, 400), np.zeros(400), alphas=[0.1], bounds="cp", n_splits=3)
    >>> rows.select("split", "found", "test_accepted").rows()
    [(0, True, 200), (1, True, 200), (2, True, 198)]
    """
    import polars as pl

    frames = []
    for alpha, bound, name, out in _iter_outcomes(scores, errors, alphas=alphas, bounds=bounds, search=search,
                                                  delta=delta, n_splits=n_splits, cal_fraction=cal_fraction,
                                                  seed=seed, grid=grid, n_min=n_min, start=start):
        frame = pl.DataFrame({"alpha": np.full(n_splits, alpha), "bound": [bound] * n_splits,
                              "search": [name] * n_splits, "split": np.arange(n_splits), **out})
        frames.append(frame.with_columns(pl.col("threshold", "fdr").fill_nan(None)))
    return pl.concat(frames)


def _mean(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else None


def _std(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(x.std()) if x.size else None


def summarize_splits(out: dict[str, np.ndarray], alpha: float) -> dict[str, Any]:
    """Aggregate per-split outcomes (found, fdr, coverage, correct_coverage) the way the paper's table does.

    FDR statistics are over the splits that found a threshold; coverage over all splits (a fail accepts
    nothing); fdr_above_alpha is the share of found splits whose test FDR exceeds alpha.
    """
    found = out["found"]
    fdr = out["fdr"][found]
    return {
        "fdr_mean": _mean(fdr), "fdr_std": _std(fdr),
        "fdr_above_alpha": float((fdr > alpha).mean()) if fdr.size else None,
        "coverage_mean": float(out["coverage"].mean()), "coverage_std": float(out["coverage"].std()),
        "correct_coverage_mean": _mean(out["correct_coverage"]),
        "correct_coverage_std": _std(out["correct_coverage"]),
        "fails": int((~found).sum()), "n_splits": int(found.shape[0]),
    }


def evaluate_splits(scores: Any, errors: Any, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                    bounds: Sequence[str] | str = ("hoeffding", "cp"), search: Sequence[str] | str = DEFAULT_SEARCH,
                    delta: float = 0.05, n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                    grid: Any = None, n_min: int | None = None, start: float | None = None,
                    progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
    """The paper's table: one row per (alpha, bound, search) over `n_splits` random calibration/test splits.

    Over the splits that found a threshold: fdr_mean, fdr_std, threshold_mean/std, and fdr_above_alpha —
    the share whose *test-set* FDR exceeds alpha (a finite test set scatters around the true risk, so this
    is not the guarantee's violation rate; `cic.simulate` measures that). Over all splits, a fail abstaining
    on everything: coverage_mean/std (accepted / test size, the paper's power) and correct_coverage_mean/std
    (accepted-and-correct / correct). Also fails, n_splits, base_error_rate (of the whole table), n_cal,
    n_test, delta, and the two limits on coverage at alpha (`cic.stats.limits`, of the whole table): score_limit
    (the best threshold on this score in-sample) and ceiling (any rule's). Standard deviations are population
    (ddof = 0); means are null where every split failed.

    Parameters
    ----------
    scores, errors, alphas, bounds, search, delta, n_splits, cal_fraction, seed, grid, n_min, start
        As in `split_outcomes` (same splits for the same seed).
    progress
        Called with (0, steps) before any work and (searches done, steps) after each, a step being one (split,
        search, bound, alpha): on 10^7 pairs a front end hears from it within seconds, not after a whole split.

    Returns
    -------
    polars.DataFrame
        One row per (alpha, bound, search).

    Examples
    --------
    >>> import numpy as np
    >>> errors = (np.arange(1000) % 10 == 0).astype(int)  # 10% wrong, spread over every score
    >>> table = evaluate_splits(np.linspace(0, 1, 1000), errors, alphas=[0.2], bounds="cp", n_splits=5)
    >>> table.select("alpha", "fails", "coverage_mean").rows()
    [(0.2, 0, 0.9968)]
    """
    import polars as pl

    from cic.stats.limits import ceiling, score_limit

    rows, limits = [], {}
    for alpha, bound, name, out in _iter_outcomes(scores, errors, alphas=alphas, bounds=bounds, search=search,
                                                  delta=delta, n_splits=n_splits, cal_fraction=cal_fraction,
                                                  seed=seed, grid=grid, n_min=n_min, start=start,
                                                  progress=progress):
        rows.append({"alpha": alpha, "bound": bound, "search": name, "delta": float(delta),
                     **summarize_splits(out, alpha),
                     "base_error_rate": float(out["base_error_rate"][0]),
                     "threshold_mean": _mean(out["threshold"][out["found"]]),
                     "threshold_std": _std(out["threshold"][out["found"]]),
                     "n_cal": int(out["n_cal"][0]), "n_test": int(out["n_test"][0])})
        if alpha not in limits:
            limits[alpha] = score_limit(scores, errors, alpha)
        rows[-1].update(score_limit=limits[alpha], ceiling=ceiling(rows[-1]["base_error_rate"], alpha))
    return pl.DataFrame(rows, schema={name: getattr(pl, kind) for name, kind in SPLIT_TABLE.items()})
