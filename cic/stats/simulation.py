"""Monte-Carlo validity: how often does a search certify a threshold whose true risk exceeds alpha?

Calibration sets are drawn from a model whose selection-conditioned risk R(t) = P(E = 1 | U <= t) is known in
closed form; each trial runs the search and checks R(t_hat) > alpha. The violation rate comes with an exact
(Clopper–Pearson) confidence interval, so "stays <= delta" is a statement with error bars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import special

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats._validation import check_positive_int, checked
from cic.stats.searches import (
    DEFAULT_SEARCH,
    FeasibilityTables,
    Setting,
    candidate_matrix,
    check_search_args,
    get_search,
    run_search,
)


class RiskModel(Protocol):
    """A score/error distribution with a closed-form selection-conditioned risk."""

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Scores sorted ascending along the last axis, and 0/1 errors drawn given them."""
        ...

    def selection_risk(self, t: np.ndarray) -> np.ndarray:
        """R(t) = P(E = 1 | U <= t); 0 where nothing is accepted."""
        ...

    def acceptance(self, t: np.ndarray) -> np.ndarray:
        """pi(t) = P(U <= t)."""
        ...

    def oracle_threshold(self, alpha: float) -> float | None:
        """sup{t : R(t) <= alpha} — the threshold an all-knowing calibrator would pick."""
        ...


@dataclass(frozen=True)
class PowerRisk:
    """U ~ Uniform(0, 1), P(E = 1 | U = u) = low + (high - low) · u^power.

    Closed form: R(t) = low + (high - low) · t^power / (power + 1) for t in (0, 1], R(1) beyond, and
    pi(t) = t clipped to [0, 1]. With low < alpha < high, R crosses alpha: the hard case for validity.

    Parameters
    ----------
    low, high : float
        Error probability at score 0 and at score 1.
    power : float
        Shape of the error curve (> 0).

    Examples
    --------
    >>> model = PowerRisk(0.0, 0.4)
    >>> float(model.selection_risk(0.5)), model.oracle_threshold(0.1)
    (0.1, 0.5)
    """

    low: float = 0.0
    high: float = 0.4
    power: float = 1.0

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise UserError(f"{name} = {v!r}: must be a probability in [0, 1]")
        if not self.power > 0:
            raise UserError(f"power = {self.power!r}: must be > 0")

    def conditional_risk(self, u: np.ndarray) -> np.ndarray:
        return self.low + (self.high - self.low) * np.clip(u, 0.0, 1.0) ** self.power

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        u = np.sort(rng.random(shape), axis=-1)
        return u, (rng.random(shape) < self.conditional_risk(u)).astype(np.int8)

    def selection_risk(self, t: np.ndarray) -> np.ndarray:
        tt = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
        return np.where(tt > 0, self.low + (self.high - self.low) * tt ** self.power / (self.power + 1), 0.0)

    def acceptance(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)

    def oracle_threshold(self, alpha: float) -> float | None:
        r1 = float(self.selection_risk(np.array(1.0)))
        if self.high >= self.low:  # R increasing in t
            if alpha < self.low:
                return None
            if r1 <= alpha:
                return 1.0
            return float(((alpha - self.low) * (self.power + 1) / (self.high - self.low)) ** (1 / self.power))
        return 1.0 if r1 <= alpha else None  # R decreasing: the largest t is best if any is


@dataclass(frozen=True)
class SimulationResult:
    """Violation rate P(R(t_hat) > alpha) over `n_trials` calibration sets, with an exact confidence interval.

    Attributes
    ----------
    n_violations, violation_rate : int, float
        Trials whose certified threshold has true risk above alpha, and their share.
    ci_low, ci_high : float
        Exact (Clopper–Pearson) interval for the violation rate at `confidence`.
    fails, mean_coverage, oracle_coverage
        Trials with no threshold; mean accepted share against the all-knowing threshold's.

    Examples
    --------
    >>> res = simulate(n=300, alpha=0.1, search="fixed_sequence", n_trials=200, seed=1)
    >>> res.verdict in ("below delta", "consistent with delta"), res.n_trials
    (True, 200)
    """

    model: str
    n: int
    alpha: float
    delta: float
    bound: str
    search: str
    n_trials: int
    n_violations: int
    violation_rate: float
    ci_low: float
    ci_high: float
    confidence: float
    fails: int
    mean_threshold: float | None
    oracle_threshold: float | None
    mean_coverage: float
    oracle_coverage: float

    @property
    def exceeds_delta(self) -> bool:
        """True when the violation rate is significantly above delta (the CI lies above it)."""
        return self.ci_low > self.delta

    @property
    def verdict(self) -> str:
        if self.exceeds_delta:
            return "exceeds delta"
        if self.ci_high <= self.delta:
            return "below delta"
        return "consistent with delta"

    def summary(self) -> str:
        pct = round(100 * self.confidence)
        return (f"{self.search}/{self.bound}, n = {self.n}, alpha = {self.alpha:g}: violation rate "
                f"{self.violation_rate:.4f} ({pct}% CI [{self.ci_low:.4f}, {self.ci_high:.4f}], "
                f"{self.n_violations}/{self.n_trials}) vs delta = {self.delta:g}: {self.verdict}; fails "
                f"{self.fails}, mean coverage {self.mean_coverage:.3f} (oracle {self.oracle_coverage:.3f})")


def binomial_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided Clopper–Pearson interval for k successes out of n."""
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, tail))
    high = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1.0 - tail))
    return low, high


@checked
def simulate(model: RiskModel | None = None, *, n: int = 1000, alpha: float = 0.1, delta: float = 0.05,
             bound: str = "cp", search: str = DEFAULT_SEARCH, n_trials: int = 1000, seed: int = 0, grid: Any = None,
             n_min: int | None = None, start: float | None = None,
             confidence: float = 0.95) -> SimulationResult:
    """Run `search` on `n_trials` calibration sets of size `n` from `model`; count R(t_hat) > alpha.

    The default model is PowerRisk(0, 0.4, 1): R(t) = 0.2 t, crossing alpha = 0.1 at t = 0.5. A valid
    procedure (fixed_sequence, multistart, holm or bonferroni with a fixed grid) has violation rate <= delta;
    `paper` search has no simultaneous guarantee and the result shows where it lands.

    Parameters
    ----------
    model : RiskModel, optional
        A score/error distribution with closed-form selection risk (default PowerRisk()).
    n, n_trials : int
        Calibration set size and number of simulated sets.
    alpha, delta, bound, search, grid, n_min, start
        As in `cic.calibrate`.
    seed : int
        Random seed; the same seed gives the same draws whatever the search (paired comparisons).
    confidence : float
        Level of the violation rate's interval.

    Returns
    -------
    SimulationResult

    Examples
    --------
    >>> res = simulate(n=500, alpha=0.1, search="paper", n_trials=300, seed=0)
    >>> 0.0 <= res.ci_low <= res.violation_rate <= res.ci_high <= 1.0
    True
    """
    model = model if model is not None else PowerRisk()
    n = check_positive_int(n, "n")
    bound = _bounds.resolve_bound(bound)
    grid_arr, n_min_v, start_v = check_search_args(search, grid, n_min, start)

    plan = get_search(search)
    k = grid_arr.shape[0] if grid_arr is not None else n  # the family size: the grid, else every score
    table = FeasibilityTables(bound, alpha, n)  # shared by every block of trials

    rng = np.random.default_rng(seed)
    block = max(1, 2_000_000 // n)
    thresholds, found_all = [], []
    for b0 in range(0, n_trials, block):
        u, e = model.sample(rng, (min(block, n_trials - b0), n))
        values, cnt, fd, candidate = candidate_matrix(u, np.cumsum(e, axis=1, dtype=np.int64), grid_arr, start_v)
        idx = run_search(plan, values, cnt, fd, setting=Setting(n, bound, alpha), delta=delta, n_min=n_min_v,
                         start=start_v, candidate=candidate, k=k, table=table).index
        found = idx >= 0
        rows = np.arange(idx.shape[0])
        thresholds.append(np.where(found, values[rows, np.maximum(idx, 0)], np.nan))
        found_all.append(found)

    thr = np.concatenate(thresholds)
    found = np.concatenate(found_all)
    risk = np.where(found, model.selection_risk(np.nan_to_num(thr)), 0.0)
    violations = int((found & (risk > alpha)).sum())
    low, high = binomial_ci(violations, n_trials, confidence)
    oracle = model.oracle_threshold(alpha)
    coverage = np.where(found, model.acceptance(np.nan_to_num(thr)), 0.0)
    return SimulationResult(
        model=repr(model), n=n, alpha=alpha, delta=delta, bound=bound, search=plan.name, n_trials=n_trials,
        n_violations=violations, violation_rate=violations / n_trials, ci_low=low, ci_high=high,
        confidence=confidence, fails=int((~found).sum()),
        mean_threshold=float(np.nanmean(thr)) if found.any() else None, oracle_threshold=oracle,
        mean_coverage=float(coverage.mean()),
        oracle_coverage=float(model.acceptance(np.array(oracle))) if oracle is not None else 0.0,
    )


