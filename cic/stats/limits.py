"""Why a gate answers what it does: the three limits on coverage at error <= alpha, and the labels that would help.

- **Ceiling** (any rule, even one that knew every label): accepting every right answer and wrong ones up to the
  rate alpha covers at most (1 - mu) / (1 - alpha) of the questions, mu the base error rate (capped at 1).
- **The score's limit**: the most a threshold on this score covers with in-sample error <= alpha (the best
  threshold chosen knowing the labels; 0 when none reaches alpha — more labels cannot fix the score).
- **Certified**: what `cic.calibrate` promises at 1 - delta (a `CalibrationResult`'s coverage).

**Labels needed** (`label_budget`, `labels_needed`): the calibration table read as a law of its own
(`EmpiricalLaw`: questions drawn with replacement, so its risk at a threshold is the table's), CIC's own search
run on `draws` sets of each size; the estimate is the smallest size certifying in at least half of them. It reads
the labels, so it is advice, not a certificate: it never changes a gate. A number is given only up to `RELIABLE`
times the table: beyond, the table's best region looks better in-sample than it is and the gap to alpha it would
need cannot be read from it, so the verdict says "more than RELIABLE× these labels" instead. How close both kinds
of claim land is measured on laws whose answer is known (`infra/scripts/labels_needed_table.py`,
docs/statistics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats._validation import as_errors, as_scores, check_open_unit
from cic.stats.searches import DEFAULT_SEARCH

#: Calibration sizes tried, as multiples of the table's (then refined between the last two by bisection).
GROWTH = (1, 2, 4, 8, 16, 32, 64)
CERTIFY_SHARE = 0.5  # "reaches alpha": certifies in at least half of the draws of that size
RELIABLE = 3  # labels needed as a number up to this many times the table; beyond, a lower bound (measured: docs)
BUDGET_FLAT = 0.01  # "more labels stop paying": doubling them adds less than this much certified coverage


def ceiling(base_error: float, alpha: float) -> float:
    """(1 - mu) / (1 - alpha), at most 1: the most any rule covers with error <= alpha at base error mu."""
    return min(1.0, (1.0 - base_error) / (1.0 - alpha))


@dataclass(frozen=True, repr=False)
class EmpiricalLaw:
    """A (score, error) table as a law (`cic.stats.simulation.RiskModel`): draws are its rows with replacement,
    its selection risk and acceptance at t those of the table."""

    scores: np.ndarray
    errors: np.ndarray

    def __post_init__(self) -> None:
        order = np.argsort(self.scores, kind="stable")
        object.__setattr__(self, "scores", np.asarray(self.scores, dtype=float)[order])
        object.__setattr__(self, "errors", np.asarray(self.errors, dtype=np.int8)[order])

    def __repr__(self) -> str:
        return f"EmpiricalLaw({self.scores.shape[0]} rows, base error {self.errors.mean():.3f})"

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        rows = np.sort(rng.integers(0, self.scores.shape[0], size=shape), axis=-1)  # sorted rows: sorted scores
        return self.scores[rows], self.errors[rows]

    def _accepted(self, t: Any) -> np.ndarray:
        return np.searchsorted(self.scores, np.asarray(t, dtype=float), side="right")

    def selection_risk(self, t: Any) -> np.ndarray:
        k = self._accepted(t)
        wrong = np.concatenate([[0], np.cumsum(self.errors)])[k]
        return np.where(k > 0, wrong / np.maximum(k, 1), 0.0)

    def acceptance(self, t: Any) -> np.ndarray:
        return self._accepted(t) / self.scores.shape[0]

    def oracle_threshold(self, alpha: float) -> float | None:
        """The largest score whose in-sample error rate among the accepted is <= alpha (ties accepted together)."""
        ends = np.r_[np.flatnonzero(np.diff(self.scores)), self.scores.shape[0] - 1]  # last row of each score
        rate = np.cumsum(self.errors)[ends] / (ends + 1)
        ok = np.flatnonzero(rate <= alpha)
        return float(self.scores[ends[ok[-1]]]) if ok.size else None


def score_limit(scores: Any, errors: Any, alpha: float) -> float:
    """The most a threshold on this score covers with in-sample error <= alpha (0 when none does)."""
    law = EmpiricalLaw(as_scores(scores), as_errors(errors))
    check_open_unit(alpha, "alpha")
    best = law.oracle_threshold(alpha)
    return 0.0 if best is None else float(law.acceptance(best))


def cause_clause(limit: float, top: float) -> str:
    """Why alpha is unattainable, in one clause, from the score's limit and any rule's ceiling (the pipeline's
    surfaces, which do not run the slow labels estimate): the score, or too few labels."""
    cause = ("no threshold on this score reaches it even in-sample: a better score or a looser α, not more labels"
             if limit == 0 else "the score reaches it in-sample, so too few labels (`cic calibrate` estimates how "
             "many)")
    return f"this score's limit {limit:.3f}, any rule's ceiling {top:.3f}: {cause}"


def window_limits(scores: Any, errors: Any, alpha: float) -> str:
    """`cause_clause` of one table at alpha."""
    e = as_errors(errors)
    return cause_clause(score_limit(scores, e, alpha), ceiling(float(e.mean()), alpha))


@dataclass(frozen=True)
class BudgetPoint:
    """Calibration size, the share of draws certifying something, and their mean coverage of the table."""

    size: int
    certified_share: float
    mean_coverage: float


def _groups(law: EmpiricalLaw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The table's distinct scores, how many rows hold each, and how many of those are wrong."""
    values, first, size = np.unique(law.scores, return_index=True, return_counts=True)
    wrong = np.add.reduceat(law.errors.astype(np.int64), first)
    return values, size, wrong


def _budget_point(law: EmpiricalLaw, size: int, *, alpha: float, delta: float, bound: str, search: str, draws: int,
                  rng: np.random.Generator) -> BudgetPoint:
    """`draws` sets of `size` rows drawn with replacement, as counts per distinct score (a multinomial, and the
    wrong ones among each score's picks a binomial: the same law as drawing rows, at the cost of the table's width,
    not the set's), calibrated by `search`."""
    from cic.stats.searches import FeasibilityTables, Setting, get_search, run_search

    values, rows, wrong = _groups(law)
    plan, table = get_search(search), FeasibilityTables(bound, alpha, size)
    share = rows / rows.sum()
    found, coverage = 0, 0.0
    block = max(1, 2_000_000 // values.shape[0])
    for b0 in range(0, draws, block):
        picks = rng.multinomial(size, share, size=min(block, draws - b0))
        errs = rng.binomial(picks, wrong / rows)
        n, fd = np.cumsum(picks, axis=1), np.cumsum(errs, axis=1)
        idx = run_search(plan, np.broadcast_to(values, n.shape), n, fd, setting=Setting(size, bound, alpha),
                         delta=delta, candidate=picks > 0, k=size, table=table).index
        ok = idx >= 0
        found += int(ok.sum())
        coverage += float(np.cumsum(rows)[idx[ok]].sum() / rows.sum())
    return BudgetPoint(size, found / draws, coverage / draws)


def label_budget(scores: Any, errors: Any, *, alpha: float, delta: float = 0.05, bound: str = "cp",
                 search: str = DEFAULT_SEARCH, sizes: Any = None, draws: int = 200,
                 seed: int = 0) -> list[BudgetPoint]:
    """Certified coverage against calibration size on the table read as a law (`EmpiricalLaw`): for each size
    (default: the table's times `GROWTH`), `draws` sets drawn with replacement, calibrated by CIC's search."""
    from cic.stats import bounds as _bounds

    law = EmpiricalLaw(as_scores(scores), as_errors(errors))
    check_open_unit(alpha, "alpha")
    check_open_unit(delta, "delta")
    n = law.scores.shape[0]
    chosen = [n * g for g in GROWTH] if sizes is None else [int(s) for s in sizes]
    if any(s < 1 for s in chosen):
        raise UserError(f"sizes = {chosen!r}: calibration sizes must be >= 1")
    bound = _bounds.resolve_bound(bound)
    return [_budget_point(law, size, alpha=alpha, delta=delta, bound=bound, search=search, draws=draws,
                          rng=np.random.default_rng([seed, size])) for size in chosen]


def stops_paying(labels: list[int], coverage: list[float]) -> int | None:
    """The first size from which doubling the labels adds less than `BUDGET_FLAT` coverage (sizes ascending,
    doubling apart); None when every doubling shown still pays — or when nothing is certified at any size."""
    if not any(c > 0 for c in coverage):
        return None
    for i in range(len(labels) - 1):
        if coverage[i] > 0 and coverage[i + 1] - coverage[i] < BUDGET_FLAT:
            return labels[i]
    return None


def labels_needed(scores: Any, errors: Any, *, alpha: float, delta: float = 0.05, bound: str = "cp",
                  search: str = DEFAULT_SEARCH, draws: int = 200, seed: int = 0) -> int | None:
    """About how many labelled answers, at this score's quality, certify alpha in `CERTIFY_SHARE` of draws; None
    when no threshold on the score reaches alpha in-sample or `RELIABLE` times the table does not (then only "more
    than that" is known: the estimate past it is measured to be mostly optimistic).

    Sizes double from the table's (halve below it) until the share certifying crosses `CERTIFY_SHARE`; the size
    is then read off the line between the two sizes around the crossing (share against log size): one calibration
    batch per doubling, and an estimate that is advice, not a count."""
    if score_limit(scores, errors, alpha) == 0.0:
        return None
    n = as_scores(scores).shape[0]

    def share(size: int) -> float:
        return label_budget(scores, errors, alpha=alpha, delta=delta, bound=bound, search=search, sizes=[size],
                            draws=draws, seed=seed)[0].certified_share

    here = share(n)
    if here >= CERTIFY_SHARE:  # already enough: how far could the table shrink?
        big, s_big = n, here
        while big > 1:
            small = big // 2
            s_small = share(small)
            if s_small < CERTIFY_SHARE:
                return _crossing(small, s_small, big, s_big)
            big, s_big = small, s_small
        return 1
    small, s_small = n, here
    for g in sorted({*(g for g in GROWTH[1:] if g < RELIABLE), RELIABLE}):
        big = n * g
        s_big = share(big)
        if s_big >= CERTIFY_SHARE:
            return _crossing(small, s_small, big, s_big)
        small, s_small = big, s_big
    return None


def _crossing(small: int, s_small: float, big: int, s_big: float) -> int:
    """The size where the share certifying reaches `CERTIFY_SHARE`, on the line through the two (log size)."""
    weight = (CERTIFY_SHARE - s_small) / (s_big - s_small)
    return max(small + 1, min(big, round(math.exp(math.log(small) + weight * math.log(big / small)))))


@dataclass(frozen=True)
class CoverageLimits:
    """The three limits side by side for one table and alpha, and — when alpha is not certified — the labels
    that would reach it (None: no threshold on the score reaches alpha in-sample, or not within `RELIABLE`× the
    table — then the sentence says "more than" that)."""

    alpha: float
    n: int
    base_error: float
    ceiling: float
    score_limit: float
    certified: float
    labels_needed: int | None

    def sentence(self) -> str:
        """The verdict in words: what is certified against what the score and any rule could reach, and why."""
        limits = (f"certified {self.certified:.3f} of questions; this score's limit {self.score_limit:.3f} "
                  f"(best threshold in-sample); any rule's ceiling {self.ceiling:.3f} (base error "
                  f"{self.base_error:.3f})")
        if self.certified > 0:
            return limits
        if self.score_limit == 0:
            why = (f"no threshold on this score reaches alpha = {self.alpha:g} even in-sample: more labels will "
                   "not help; a better score or a looser alpha will")
        elif self.labels_needed is None:
            why = (f"too few labels: more than {(RELIABLE - 1) * self.n:,} more (over {RELIABLE}x these {self.n:,}) "
                   f"at this score's quality to reach alpha = {self.alpha:g} — how many more cannot be read from "
                   "these labels (docs/statistics.md, 'Why a gate answers what it does')")
        elif self.labels_needed <= self.n:
            why = (f"an unlucky draw: at this score's quality about {self.labels_needed:,} labels reach alpha = "
                   f"{self.alpha:g} half the time or more (an estimate from these labels: docs/statistics.md, 'Why a "
                   "gate answers what it does'); a larger calibration set likely will")
        else:
            more = self.labels_needed - self.n
            why = (f"too few labels: about {more:,} more labelled answers at this score's quality reach alpha = "
                   f"{self.alpha:g} ({self.labels_needed:,} in all; an estimate from these labels: docs/statistics.md, "
                   "'Why a gate answers what it does')")
        return f"{limits}; {why}"


def coverage_limits(scores: Any, errors: Any, *, alpha: float, certified: float, delta: float = 0.05,
                    bound: str = "cp", search: str = DEFAULT_SEARCH, draws: int = 200,
                    seed: int = 0) -> CoverageLimits:
    """`CoverageLimits` of a table whose gate covers `certified` (its coverage; 0 when alpha is unattainable);
    the labels needed are estimated only when nothing is certified."""
    u, e = as_scores(scores), as_errors(errors)
    check_open_unit(alpha, "alpha")
    base = float(e.mean())
    limit = score_limit(u, e, alpha)
    needed = (labels_needed(u, e, alpha=alpha, delta=delta, bound=bound, search=search, draws=draws, seed=seed)
              if certified <= 0 and limit > 0 else None)
    return CoverageLimits(float(alpha), int(u.shape[0]), base, ceiling(base, alpha), limit, float(certified), needed)
