"""Baselines on the same data and the same splits as CIC, to show what the certificate buys.

Every method sees the calibration part of each split from `cic.split_masks` (so with the same `seed` and
`cal_fraction` the splits are exactly those of `cic.evaluate_splits`) and is measured on the test part the way
CIC is: test FDR (errors among accepted), coverage (accepted / test size), correct coverage, fails.

The methods, on one calibration set of scores U_i (lower = surer) and errors E_i, with n(t) = #{U_i <= t}
and FD(t) = #{U_i <= t, E_i = 1}, candidates t being the distinct calibration scores:

- `naive`: the largest t with FD(t) / n(t) <= alpha. No confidence bound, no guarantee: the plug-in rule a
  practitioner writes first; its test FDR exceeds alpha in about half of the splits near the boundary.
- `coin_binary` (COIN-style, Wang et al. 2025): binary search over the sorted distinct calibration scores
  (a data-dependent grid) for the boundary where the upper confidence bound `bound` at level delta crosses
  alpha, assuming the bound is monotone in t: probe the middle candidate; if its UCB <= alpha remember it and
  search above, else search below. Returns the last candidate that passed (or none). Claims a high-probability
  guarantee (UCB at delta), but the grid and the probed path are chosen from the data with no multiplicity
  correction, and when the bound is not monotone the search can stop below larger certified thresholds.
  (COIN's text available to us states only "Clopper–Pearson upper bound on the calibration error rate, the
  largest threshold whose bound is <= alpha"; the binary search is the variant this project was asked to
  compare, described here exactly as implemented.)
- `conformal_alignment` (Gui, Jin & Ren 2024): conformal p-values from the misaligned calibration items,
  p_j = (1 + #{i : E_i = 1, U_i <= U_j}) / (n + 1) for each test item j, then Benjamini–Hochberg at level
  alpha over the m test items: accept the k* most confident, k* = max{k : p_(k) <= k alpha / m}. Guarantee in
  expectation: E[FDP] <= alpha over calibration and test draws. The selection depends on the test batch, so
  there is no single threshold (the reported one is the largest accepted test score).
- `lec` (marginal LEC-style rule, after Wang et al.'s linear expectation constraint): the largest t with
  sum_{U_i <= t} (E_i - alpha) <= -1, i.e. FD(t) + 1 <= alpha n(t). The margin reserves room for a
  worst-case test point (an accepted error adds 1 - alpha <= 1 to the sum), the exchangeability argument
  behind P(error and accepted) <= alpha P(accepted) marginally: a guarantee in expectation over calibration
  and test draws, not with high probability. (-1 is LEC's finite-sample condition, its Eq. 5 as summarised
  from arXiv 2512.01556; the `lec` search of `cic.stats.searches` is the same rule, `searches.lec_feasible`.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.errors import UserError
from cic.registry import Registry
from cic.stats import bounds as _bounds
from cic.stats import searches
from cic.stats._validation import as_pair, as_scores, checked
from cic.stats.calibration import SortedCalibration
from cic.stats.protocol import DEFAULT_ALPHAS, SortedSplits, evaluate_splits, gather, split_measures, summarize_splits
from cic.stats.searches import get_search

if TYPE_CHECKING:
    import polars as pl

#: Floating tolerance for the plug-in comparisons FD <= alpha n (alpha n is often an integer in exact arithmetic).
_EPS = 1e-9


@dataclass(frozen=True)
class Method:
    """A selection rule compared in the baselines table, with the guarantee it claims."""

    name: str
    label: str
    guarantee: str  # "high-probability", "expectation" or "none"
    claim: str


METHODS: Registry[Method] = Registry("method", (
    Method("naive", "naive plug-in", "none", "none: largest t with calibration FD/n <= alpha"),
    Method("coin_binary", "COIN-style binary search", "high-probability",
           "P(FDR <= alpha) >= 1 - delta claimed per probed threshold; data-dependent grid, no correction"),
    Method("conformal_alignment", "Conformal Alignment (BH)", "expectation",
           "E[FDP] <= alpha (conformal p-values + Benjamini-Hochberg)"),
    Method("lec", "LEC-style marginal rule", "expectation",
           "E[accepted errors] <= alpha E[accepted]: sum (E_i - alpha) <= -1 over accepted"),
))

# ----------------------------------------------------------------------------------------------------------
# One calibration set (the definitions, also the reference for the vectorised versions)


def _distinct_counts(scores: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct scores ascending with n(t) and FD(t) at each (ties accepted together)."""
    return SortedCalibration.build(scores, errors).unique_candidates()


def _largest(values: np.ndarray, ok: np.ndarray) -> float | None:
    hit = np.flatnonzero(ok)
    return float(values[hit[-1]]) if hit.size else None


@checked
def naive_threshold(scores: Any, errors: Any, alpha: float) -> float | None:
    """The largest calibration score t with empirical error FD(t)/n(t) <= alpha; None when there is none."""
    s, e = as_pair(scores, errors)
    values, n, fd = _distinct_counts(s, e)
    return _largest(values, fd <= alpha * n + _EPS)


@checked
def lec_threshold(scores: Any, errors: Any, alpha: float) -> float | None:
    """The largest calibration score t with sum_{U_i <= t} (E_i - alpha) <= -1; None when there is none."""
    s, e = as_pair(scores, errors)
    values, n, fd = _distinct_counts(s, e)
    return _largest(values, searches.lec_feasible(fd, n, alpha))


def lec_routing(scores: Sequence[Any], errors: Sequence[Any], alpha: float, *,
                grid: int = 40) -> tuple[float | None, float | None]:
    """LEC's two-model routing rule as its condition reads: among the pairs of thresholds on a grid x grid of
    score quantiles (or None: the model never answers), the pair answering the most calibration questions with
    FD + 1 <= alpha·n over the system's answers (first model answers when within its threshold, else the
    second). A guarantee in expectation only, with no correction for the grid search; a baseline beside
    `cic.stats.cascades.calibrate_cascade`."""
    from cic.stats.cascades import answering_model

    us = [np.asarray(u, dtype=float) for u in scores]
    es = [np.asarray(e, dtype=np.int64) for e in errors]
    grids = [np.quantile(u, np.linspace(0, 1, grid + 1)[1:]) for u in us]
    best, chosen = -1, (None, None)
    for t1 in (None, *grids[0]):
        for t2 in (None, *grids[1]):
            answering = answering_model(us, (t1, t2))
            n = int((answering < 2).sum())
            wrong = int(np.where(answering == 0, es[0], np.where(answering == 1, es[1], 0)).sum())
            if n > best and searches.lec_feasible(np.array([wrong]), np.array([n]), alpha)[0]:
                best, chosen = n, (None if t1 is None else float(t1), None if t2 is None else float(t2))
    return chosen


@checked
def coin_binary_threshold(scores: Any, errors: Any, alpha: float, *, delta: float = 0.05,
                          bound: str = "cp") -> float | None:
    """COIN-style binary search over the distinct calibration scores (see the module docstring)."""
    s, e = as_pair(scores, errors)
    values, n, fd = _distinct_counts(s, e)
    lo, hi, best = 0, values.shape[0] - 1, -1
    while lo <= hi:
        mid = (lo + hi) // 2
        if _bounds.feasible(bound, int(fd[mid]), int(n[mid]), alpha, delta):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return float(values[best]) if best >= 0 else None


@checked
def conformal_alignment_select(cal_scores: Any, cal_errors: Any, test_scores: Any, alpha: float) -> np.ndarray:
    """Boolean mask over `test_scores`: the items Conformal Alignment accepts at FDR level alpha (BH)."""
    s, e = as_pair(cal_scores, cal_errors)
    test = as_scores(test_scores, "test_scores")
    wrong_scores = np.sort(s[e == 1])
    p = (1 + np.searchsorted(wrong_scores, test, side="right")) / (s.shape[0] + 1)
    m = test.shape[0]
    p_sorted = np.sort(p)
    passing = np.flatnonzero(p_sorted * m <= np.arange(1, m + 1) * alpha * (1 + _EPS))
    if not passing.size:
        return np.zeros(m, dtype=bool)
    return p <= p_sorted[passing[-1]]


# ----------------------------------------------------------------------------------------------------------
# All splits at once


def _select_threshold(n: np.ndarray, fd: np.ndarray, valid: np.ndarray, method: str, alpha: float,
                      delta: float, bound: str, n_cal: int) -> np.ndarray:
    """Per split, the chosen candidate column (-1 = none) for the threshold methods."""
    if method == "naive":
        return searches.last_true(valid & (n > 0) & (fd <= alpha * n + _EPS))
    if method == "lec":
        return searches.last_true(valid & searches.lec_feasible(fd, n, alpha))
    # coin_binary: a binary search per split over its own candidates (the valid columns, in order)
    kmax = _bounds.max_errors(bound, np.arange(n_cal + 1), alpha, delta)
    order = np.argsort(~valid, axis=1, kind="stable")  # valid columns first, ascending
    rows = np.arange(n.shape[0])
    lo, hi = np.zeros(n.shape[0], dtype=np.int64), valid.sum(axis=1) - 1
    best = np.full(n.shape[0], -1, dtype=np.int64)
    while (active := lo <= hi).any():
        mid = np.where(active, (lo + hi) // 2, 0)
        col = order[rows, mid]
        ok = fd[rows, col] <= kmax[n[rows, col]]
        best = np.where(active & ok, mid, best)
        lo = np.where(active & ok, mid + 1, lo)
        hi = np.where(active & ~ok, mid - 1, hi)
    return np.where(best >= 0, order[rows, np.maximum(best, 0)], -1)


@checked
def _iter_baselines(scores: Any, errors: Any, *, alphas: Sequence[float], methods: Sequence[str], delta: float,
                    bound: str, n_splits: int, cal_fraction: float,
                    seed: int) -> Iterator[tuple[float, str, dict[str, np.ndarray]]]:
    s, e = as_pair(scores, errors)
    bound = _bounds.resolve_bound(bound)
    alpha_list = list(alphas)  # checked from the declaration (`checked`)
    if not alpha_list:
        raise UserError("alphas is empty: give at least one")
    method_list = [METHODS.lookup(m).name for m in methods]
    if not method_list:
        raise UserError("methods is empty: give at least one of " + ", ".join(METHODS))
    data = SortedSplits.build(s, e, n_splits, cal_fraction, seed)
    pos = data.unique_positions()
    values = data.scores[pos]
    run_end = data.run_ends()

    parts: dict[tuple[float, str], list[dict[str, np.ndarray]]] = {}
    for blk in data.blocks():
        n, fd = gather(blk.cum_n, pos), gather(blk.cum_fd, pos)
        prev = np.concatenate([np.zeros((n.shape[0], 1), dtype=np.int64), n[:, :-1]], axis=1)
        valid = n > prev
        t_acc, t_fd = gather(blk.cum_tn, pos), gather(blk.cum_tfd, pos)
        rows = np.arange(n.shape[0])
        cal_wrong_at_or_below = blk.cum_fd[:, run_end]  # per sorted item: calibration errors with U_i <= U_j
        for alpha in alpha_list:
            for method in method_list:
                if method == "conformal_alignment":
                    # p_j <= k alpha / m, with k the test rank of item j (ties share p, so they pass together)
                    ok = ~blk.cal & ((1 + cal_wrong_at_or_below) * data.n_test
                                     <= blk.cum_tn * alpha * (data.n_cal + 1) * (1 + _EPS))
                    idx = searches.last_true(ok)
                    found, safe = idx >= 0, np.maximum(idx, 0)
                    acc = np.where(found, blk.cum_tn[rows, safe], 0)
                    wrong = np.where(found, blk.cum_tfd[rows, safe], 0)
                    threshold = np.where(found, data.scores[safe], np.nan)
                else:
                    idx = _select_threshold(n, fd, valid, method, alpha, delta, bound, data.n_cal)
                    found, safe = idx >= 0, np.maximum(idx, 0)
                    acc = np.where(found, t_acc[rows, safe], 0)
                    wrong = np.where(found, t_fd[rows, safe], 0)
                    threshold = np.where(found, values[safe], np.nan)
                parts.setdefault((alpha, method), []).append({
                    "found": found, "threshold": threshold, "test_accepted": acc, "test_errors": wrong,
                    **split_measures(found, acc, wrong, blk.test_correct, data.n_test)})
    for alpha in alpha_list:
        for method in method_list:
            chunks = parts[(alpha, method)]
            yield alpha, method, {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}


def baseline_outcomes(scores: Any, errors: Any, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                      methods: Sequence[str] = tuple(METHODS), delta: float = 0.05, bound: str = "cp",
                      n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0) -> pl.DataFrame:
    """One row per (alpha, method, split): found, threshold, test counts, test FDR, coverage, correct coverage.

    `bound` and `delta` are used by `coin_binary` only. The splits are `cic.split_masks(n, n_splits,
    cal_fraction, seed)`, the same as `cic.split_outcomes` with the same arguments.
    """
    import polars as pl

    frames = []
    for alpha, method, out in _iter_baselines(scores, errors, alphas=alphas, methods=methods, delta=delta,
                                              bound=bound, n_splits=n_splits, cal_fraction=cal_fraction, seed=seed):
        frames.append(pl.DataFrame({"alpha": np.full(n_splits, alpha), "method": [method] * n_splits,
                                    "split": np.arange(n_splits), **out}).with_columns(
            pl.col("threshold", "fdr").fill_nan(None)))
    return pl.concat(frames)


def compare_methods(scores: Any, errors: Any, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                    methods: Sequence[str] = tuple(METHODS),
                    cic_searches: Sequence[str] = ("paper", "fallback", "geometric", "fixed_sequence",
                                                                   "multistart"),
                    delta: float = 0.05,
                    bound: str = "cp", n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                    grid: Any = None, known: pl.DataFrame | None = None) -> pl.DataFrame:
    """The baselines table: one row per (alpha, method), CIC's searches first, all on the same splits.

    Columns: alpha, method, label, guarantee (high-probability / expectation / none), claim, fdr_mean,
    fdr_std, fdr_above_alpha (share of splits with a selection whose test FDR > alpha), coverage_mean,
    coverage_std, correct_coverage_mean, correct_coverage_std, fails, n_splits, and fdp_mean: the FDP
    averaged over all splits with 0 where nothing was accepted (what E[FDP] <= alpha refers to).
    Each CIC search is labelled with the guarantee its registry entry carries (`paper`: none). `grid` is
    passed to the searches that take one (holm, bonferroni need it). `known`: evaluation rows (with delta,
    n_splits, seed and cal_fraction columns, as `cic.reports.report.evaluate_groups` writes them); rows whose
    split protocol matches these arguments exactly are reused, anything else is recomputed.
    """
    import polars as pl

    bound = _bounds.resolve_bound(bound)
    rows: list[dict[str, Any]] = []
    protocol = {"delta": float(delta), "n_splits": int(n_splits), "seed": int(seed),
                "cal_fraction": float(cal_fraction)}
    done = None
    if known is not None and set(protocol) <= set(known.columns):
        done = known.filter(pl.col("search").is_in(list(cic_searches)) & pl.col("alpha").is_in(list(alphas))
                            & (pl.col("bound") == bound), *(pl.col(c) == v for c, v in protocol.items()))
    by_key = {(r["search"], r["alpha"]): r for r in (done.iter_rows(named=True) if done is not None else [])}
    missing = [s for s in cic_searches if any((s, float(a)) not in by_key for a in alphas)]
    for search in missing:
        extra = {"grid": grid} if get_search(search).takes_grid and grid is not None else {}
        table = evaluate_splits(scores, errors, alphas=alphas, bounds=bound, search=search, delta=delta,
                                n_splits=n_splits, cal_fraction=cal_fraction, seed=seed, **extra)
        by_key.update({(r["search"], r["alpha"]): r for r in table.iter_rows(named=True)})
    for search in cic_searches:
        plan = get_search(search)
        for alpha in alphas:
            r = by_key[(plan.name, float(alpha))]
            rows.append({"alpha": r["alpha"], "method": f"cic_{plan.name}", "label": f"CIC ({plan.name}, {bound})",
                         "guarantee": plan.guarantee_kind, "claim": plan.claim,
                         **{k: r[k] for k in _SUMMARY_COLUMNS}})
    for alpha, method, out in _iter_baselines(scores, errors, alphas=alphas, methods=methods, delta=delta,
                                              bound=bound, n_splits=n_splits, cal_fraction=cal_fraction, seed=seed):
        info = METHODS[method]
        label = f"{info.label} ({bound})" if method == "coin_binary" else info.label
        rows.append({"alpha": alpha, "method": method, "label": label, "guarantee": info.guarantee,
                     "claim": info.claim, **summarize_splits(out, alpha)})
    schema = {"alpha": pl.Float64, "method": pl.String, "label": pl.String, "guarantee": pl.String,
              "claim": pl.String, **{k: pl.Int64 if k in ("fails", "n_splits") else pl.Float64
                                     for k in _SUMMARY_COLUMNS}}
    table = pl.DataFrame(rows, schema=schema).sort("alpha", maintain_order=True)
    # the quantity the expectation guarantees bound: FDP averaged over all splits, 0 where nothing was accepted
    found_share = 1 - pl.col("fails") / pl.col("n_splits")
    return table.with_columns(fdp_mean=(pl.col("fdr_mean") * found_share).fill_null(0.0))


_SUMMARY_COLUMNS = ("fdr_mean", "fdr_std", "fdr_above_alpha", "coverage_mean", "coverage_std",
                    "correct_coverage_mean", "correct_coverage_std", "fails", "n_splits")
