"""The paper's evaluation protocol: repeated random calibration/test splits, FDR and power per (alpha, bound).

For each split, calibrate on the calibration part and measure on the test part: test FDR (errors among
accepted), `coverage` = accepted / test size (the paper's power) and `correct_coverage` = accepted-and-correct
/ correct (COIN's power). A split with no certified threshold counts in `fails` and abstains on everything
(coverage 0); FDR statistics are over the splits that found a threshold.

Everything is vectorised across splits: the data are sorted once, each split is a boolean mask over the
sorted order, and n(t), FD(t) for every split and candidate come from cumulative sums.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.stats import bounds as _bounds
from cic.stats import searches as batch_search
from cic.stats._validation import as_pair, check_open_unit, check_positive_int
from cic.stats.calibration import SEARCH_NAMES, check_search_args

if TYPE_CHECKING:
    import polars as pl

DEFAULT_ALPHAS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.25)

#: Largest number of (split × item) cells held at once; splits are processed in blocks below this.
_BLOCK_CELLS = 4_000_000


def calibration_size(n_items: int, cal_fraction: float) -> int:
    """round(cal_fraction × n_items), refused when either side of the split would be empty."""
    cal_fraction = check_open_unit(cal_fraction, "cal_fraction")
    n_cal = int(round(cal_fraction * n_items))
    if n_cal < 1:
        raise ValueError(f"cal_fraction = {cal_fraction!r} with {n_items} items leaves a calibration set of "
                         "size 0")
    if n_cal > n_items - 1:
        raise ValueError(f"cal_fraction = {cal_fraction!r} with {n_items} items leaves a test set of size 0")
    return n_cal


def split_masks(n_items: int, n_splits: int, cal_fraction: float, seed: int = 0) -> np.ndarray:
    """Boolean (n_splits, n_items) matrix; True marks the calibration items of each split.

    Each row holds exactly round(cal_fraction × n_items) True values in uniformly random positions; the
    same seed gives the same splits, so other tools can reproduce the protocol item by item.
    """
    n_splits = check_positive_int(n_splits, "n_splits")
    n_cal = calibration_size(n_items, cal_fraction)
    base = np.zeros((n_splits, n_items), dtype=bool)
    base[:, :n_cal] = True
    return np.random.default_rng(seed).permuted(base, axis=1)


@dataclass(frozen=True)
class _Candidates:
    values: np.ndarray  # ascending threshold values
    pos: np.ndarray  # index of the last sorted item <= value (-1 when none)
    always_valid: np.ndarray  # grid points and the start are candidates in every split


def _candidates(sorted_scores: np.ndarray, search: str, grid: np.ndarray | None,
                start: float | None) -> _Candidates:
    if grid is not None:
        pos = np.searchsorted(sorted_scores, grid, side="right") - 1
        return _Candidates(grid, pos, np.ones(grid.shape[0], dtype=bool))
    run_end = np.flatnonzero(np.append(sorted_scores[1:] != sorted_scores[:-1], True))
    values, always = sorted_scores[run_end], np.zeros(run_end.shape[0], dtype=bool)
    if search == "fixed_sequence" and start is not None:
        at = int(np.searchsorted(values, start))
        if at == values.shape[0] or values[at] != start:
            values = np.insert(values, at, start)
            run_end = np.insert(run_end, at, np.searchsorted(sorted_scores, start, side="right") - 1)
            always = np.insert(always, at, False)
        always[at] = True
    return _Candidates(values, run_end, always)


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

    Shared by the protocol and the baselines (`cic.stats.baselines`), so every method sees exactly the same splits.
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


def test_measures(found: np.ndarray, accepted: np.ndarray, wrong: np.ndarray, test_correct: np.ndarray,
                  n_test: int) -> dict[str, np.ndarray]:
    """Per split: test FDR (NaN on a fail; 0 when nothing was accepted), coverage and correct coverage."""
    with np.errstate(invalid="ignore", divide="ignore"):
        fdr = np.where(accepted > 0, wrong / np.maximum(accepted, 1), 0.0)
        correct_cov = np.where(test_correct > 0, (accepted - wrong) / np.maximum(test_correct, 1), np.nan)
    return {"fdr": np.where(found, fdr, np.nan), "coverage": accepted / n_test, "correct_coverage": correct_cov}


def _as_names(value: Any, name: str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    if not items:
        raise ValueError(f"{name} is empty: give at least one")
    return items


def _iter_outcomes(scores: Any, errors: Any, *, alphas: Sequence[float], bounds: Sequence[str] | str,
                   search: Sequence[str] | str, delta: float, n_splits: int, cal_fraction: float, seed: int,
                   grid: Any, n_min: int | None, start: float | None
                   ) -> Iterator[tuple[float, str, str, dict[str, np.ndarray]]]:
    s, e = as_pair(scores, errors)
    delta = check_open_unit(delta, "delta")
    alpha_list = [check_open_unit(a, f"alphas[{i}]") for i, a in enumerate(_as_names(
        [alphas] if np.ndim(alphas) == 0 else alphas, "alphas"))]
    bound_list = [_bounds.resolve_bound(b) for b in _as_names(bounds, "bounds")]
    search_list = _as_names(search, "search")
    checked = {name: check_search_args(name, grid, n_min if name == "fixed_sequence" else None,
                                       start if name == "fixed_sequence" else None) for name in search_list}
    for name in search_list:
        if name not in SEARCH_NAMES:  # pragma: no cover - check_search_args already refused it
            raise ValueError(f"search = {name!r}: unknown")
    data = SortedSplits.build(s, e, n_splits, cal_fraction, seed)
    cands = {name: _candidates(data.scores, name, checked[name][0], checked[name][2]) for name in search_list}

    results: dict[tuple[float, str, str], list[dict[str, np.ndarray]]] = {}
    for blk in data.blocks():
        for name in search_list:
            c = cands[name]
            n, fd = gather(blk.cum_n, c.pos), gather(blk.cum_fd, c.pos)
            prev = np.concatenate([np.zeros((n.shape[0], 1), dtype=np.int64), n[:, :-1]], axis=1)
            valid = c.always_valid[None, :] | (n > prev)
            t_acc, t_fd = gather(blk.cum_tn, c.pos), gather(blk.cum_tfd, c.pos)
            k = c.values.shape[0]
            for bound in bound_list:
                for alpha in alpha_list:
                    gamma = delta / k if name == "bonferroni" else delta
                    eligible = valid
                    if name == "fixed_sequence":
                        floor = checked[name][1]
                        if floor is None and checked[name][2] is None:
                            floor = _bounds.half_alpha_n(bound, alpha, gamma)
                        if floor is not None:
                            eligible = eligible & (n >= floor)
                        if checked[name][2] is not None:
                            eligible = eligible & (c.values >= checked[name][2])[None, :]
                    feas = batch_search.feasibility(bound, fd, n, alpha, gamma)
                    idx = batch_search.select(feas, eligible, name)
                    found = idx >= 0
                    rows = np.arange(idx.shape[0])
                    safe = np.maximum(idx, 0)
                    acc = np.where(found, t_acc[rows, safe], 0)
                    wrong = np.where(found, t_fd[rows, safe], 0)
                    results.setdefault((alpha, bound, name), []).append({
                        "found": found,
                        "threshold": np.where(found, c.values[safe], np.nan),
                        "cal_accepted": np.where(found, n[rows, safe], 0),
                        "cal_errors": np.where(found, fd[rows, safe], 0),
                        "test_accepted": acc, "test_errors": wrong,
                        **test_measures(found, acc, wrong, blk.test_correct, data.n_test),
                    })
    for name in search_list:
        for bound in bound_list:
            for alpha in alpha_list:
                parts = results[(alpha, bound, name)]
                merged = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
                merged["n_cal"] = np.full(n_splits, data.n_cal)
                merged["n_test"] = np.full(n_splits, data.n_test)
                merged["base_error_rate"] = np.full(n_splits, e.mean())
                yield alpha, bound, name, merged


def split_outcomes(scores: Any, errors: Any, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                   bounds: Sequence[str] | str = ("hoeffding", "cp"), search: Sequence[str] | str = "paper",
                   delta: float = 0.05, n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                   grid: Any = None, n_min: int | None = None, start: float | None = None) -> pl.DataFrame:
    """One row per (alpha, bound, search, split): threshold (null on a fail), test FDR, coverage, counts."""
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
                    bounds: Sequence[str] | str = ("hoeffding", "cp"), search: Sequence[str] | str = "paper",
                    delta: float = 0.05, n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                    grid: Any = None, n_min: int | None = None, start: float | None = None) -> pl.DataFrame:
    """The paper's table: one row per (alpha, bound, search) over `n_splits` random calibration/test splits.

    Over the splits that found a threshold: fdr_mean, fdr_std, threshold_mean/std, and fdr_above_alpha —
    the share whose *test-set* FDR exceeds alpha (a finite test set scatters around the true risk, so this
    is not the guarantee's violation rate; `cic.simulate` measures that). Over all splits, a fail abstaining
    on everything: coverage_mean/std (accepted / test size, the paper's power) and correct_coverage_mean/std
    (accepted-and-correct / correct). Also fails, n_splits, base_error_rate (of the whole table), n_cal,
    n_test, delta. Standard deviations are population (ddof = 0); means are null where every split failed.
    """
    import polars as pl

    rows = []
    for alpha, bound, name, out in _iter_outcomes(scores, errors, alphas=alphas, bounds=bounds, search=search,
                                                  delta=delta, n_splits=n_splits, cal_fraction=cal_fraction,
                                                  seed=seed, grid=grid, n_min=n_min, start=start):
        rows.append({"alpha": alpha, "bound": bound, "search": name, "delta": float(delta),
                     **summarize_splits(out, alpha),
                     "base_error_rate": float(out["base_error_rate"][0]),
                     "threshold_mean": _mean(out["threshold"][out["found"]]),
                     "threshold_std": _std(out["threshold"][out["found"]]),
                     "n_cal": int(out["n_cal"][0]), "n_test": int(out["n_test"][0])})
    return pl.DataFrame(rows, schema={
        "alpha": pl.Float64, "bound": pl.String, "search": pl.String, "delta": pl.Float64,
        "fdr_mean": pl.Float64, "fdr_std": pl.Float64, "fdr_above_alpha": pl.Float64,
        "coverage_mean": pl.Float64, "coverage_std": pl.Float64, "correct_coverage_mean": pl.Float64,
        "correct_coverage_std": pl.Float64, "fails": pl.Int64, "n_splits": pl.Int64,
        "base_error_rate": pl.Float64, "threshold_mean": pl.Float64, "threshold_std": pl.Float64,
        "n_cal": pl.Int64, "n_test": pl.Int64,
    })
