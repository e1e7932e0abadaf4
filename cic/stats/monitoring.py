"""Anytime-valid monitoring of a live gate: does the error rate among answered questions stay ≤ α, checked
night after night on a growing window, with a false-alarm guarantee over the whole open-ended schedule?

A fixed-level test repeated on accumulating data (optional stopping) raises false alarms far more often than
its level. Here the evidence against H0: p ≤ α is a test supermartingale — a mixture of betting wealths

    W_n(m) = (1/J) Σ_j (1 + λ_j(m)(1 − m))^k (1 − λ_j(m) m)^(n − k),   λ_j(m) = c_j / m,  c_j ∈ (0, 1),

after n answered questions of which k were wrong. Each term is the wealth of a constant bet, so under any
p ≤ m it is a nonnegative supermartingale with W_0 = 1; so is their average. Ville's inequality gives
P(sup_n W_n(α) ≥ 1/level) ≤ level: alarming when the e-value W_n(α) crosses 1/level keeps the chance of any
false alarm, ever, at most `level` while the rate stays ≤ α. The same wealth at every m gives a confidence
sequence for the rate: {m : W_n(m) < 1/level} holds p at all n with probability ≥ 1 − level; its lower end,
carried as a running maximum, is the rate's anytime-valid lower confidence bound. The state is (n, k) alone.

Several live gates monitored at once: alarm on gate g when its e-value crosses G/level (Bonferroni over the G
gates, valid for e-values under any dependence), or average their e-values, which is again an e-value.

`fixed_level_alarms` is the comparison the product replaced: the exact one-sided binomial test on the growing
window each night at a fixed level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cic.errors import UserError
from cic.stats._validation import check_open_unit

#: fractions of the largest safe bet 1/m; a spread of bets makes the mixture powerful against small and large
#: excesses over α alike
BET_FRACTIONS = np.array([0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9])


def log_wealth(n: np.ndarray | int, k: np.ndarray | int, m: float,
               fractions: np.ndarray = BET_FRACTIONS) -> np.ndarray:
    """log W_n(m) for arrays of (n, k): the log of the mixture of constant bets λ_j = c_j / m."""
    check_open_unit(m, "m")
    n_arr, k_arr = np.asarray(n, dtype=float), np.asarray(k, dtype=float)
    lam = np.asarray(fractions, dtype=float) / m
    per_bet = (k_arr[..., None] * np.log1p(lam * (1 - m)) + (n_arr - k_arr)[..., None] * np.log1p(-lam * m))
    top = per_bet.max(axis=-1)
    return top + np.log(np.exp(per_bet - top[..., None]).mean(axis=-1))


MAX_LOG_E = 700.0


def e_value(n: int, k: int, alpha: float) -> float:
    """The evidence against 'error rate ≤ alpha' after n answered questions with k errors (1 at n = 0); capped at
    e^700 (~1e304), far past any alarm level, so it stays a finite number every store and tracker accepts."""
    return float(np.exp(min(log_wealth(n, k, alpha), MAX_LOG_E)))


def lower_bound(n: int, k: int, level: float, *, tol: float = 1e-6) -> float:
    """The smallest rate m not rejected at `level` after (n, k): the confidence sequence's lower end at this
    time (0 when nothing is rejected). W_n(m) falls as m grows, so bisection finds it."""
    check_open_unit(level, "level")
    threshold = np.log(1 / level)
    if n == 0 or log_wealth(n, k, tol) < threshold:
        return 0.0
    low, high = tol, 1 - tol
    if log_wealth(n, k, high) >= threshold:
        return high
    while high - low > tol:
        mid = (low + high) / 2
        if log_wealth(n, k, mid) >= threshold:
            low = mid
        else:
            high = mid
    return low


@dataclass(frozen=True)
class MonitorState:
    """A live gate's monitor after some nights: answered questions, errors among them, the e-value against
    'rate ≤ alpha', the running lower confidence bound on the rate, and whether it has alarmed."""

    alpha: float
    level: float
    n: int = 0
    k: int = 0
    e_value: float = 1.0
    rate_lower_bound: float = 0.0
    alarmed: bool = False

    def update(self, answered: int, errors: int) -> MonitorState:
        """The state after one more night (`answered` questions the gate answered, `errors` of them wrong)."""
        if not 0 <= errors <= answered:
            raise UserError(f"errors = {errors}, answered = {answered}: need 0 <= errors <= answered")
        n, k = self.n + answered, self.k + errors
        e = e_value(n, k, self.alpha)
        lcb = max(self.rate_lower_bound, lower_bound(n, k, self.level))
        return MonitorState(self.alpha, self.level, n, k, e, lcb, self.alarmed or e >= 1 / self.level)


def monitor_alarms(answered: np.ndarray, errors: np.ndarray, alpha: float, level: float) -> np.ndarray:
    """For nightly counts of shape (repetitions, nights): the first night (1-based) each repetition's e-value
    crossed 1/level, 0 when it never did."""
    n, k = np.cumsum(answered, axis=-1), np.cumsum(errors, axis=-1)
    crossed = log_wealth(n, k, alpha) >= np.log(1 / level)
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, 0)


def fixed_level_alarms(answered: np.ndarray, errors: np.ndarray, alpha: float, level: float) -> np.ndarray:
    """The same as `monitor_alarms` for the exact one-sided binomial test of 'rate ≤ alpha' run each night at a
    fixed `level` on the whole window so far (what a naive nightly schedule does)."""
    from scipy.stats import binom

    n, k = np.cumsum(answered, axis=-1), np.cumsum(errors, axis=-1)
    p = binom.sf(k - 1, n, alpha)  # P(Binomial(n, alpha) >= k)
    crossed = p <= level
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, 0)


def simulate_schedule(*, alpha: float = 0.1, level: float = 0.01, nights: int = 365, per_night: int = 100,
                      shift: float = 0.0, repetitions: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """Nightly checks of a live gate whose answered questions are wrong with probability alpha + shift:
    the first alarm night of each repetition under both rules (0 = never)."""
    rate = alpha + shift
    check_open_unit(rate, "alpha + shift")
    rng = np.random.default_rng(seed)
    answered = np.full((repetitions, nights), per_night)
    errors = rng.binomial(per_night, rate, size=(repetitions, nights))
    return {"anytime": monitor_alarms(answered, errors, alpha, level),
            "fixed_level": fixed_level_alarms(answered, errors, alpha, level)}


def schedule_study(*, alpha: float = 0.1, level: float = 0.01, nights: int = 365, per_night: int = 100,
                   shifts: tuple[float, ...] = (0.0, 0.02, 0.05, 0.10), repetitions: int = 10_000,
                   seed: int = 0, confidence: float = 0.99) -> list[dict[str, float | str | int]]:
    """Both rules on the same simulated years: per shift, the share of years with an alarm (with an exact
    Clopper–Pearson interval at `confidence`) and the median and 90th-percentile night of the first alarm."""
    from scipy.stats import beta

    rows: list[dict[str, float | str | int]] = []
    for i, shift in enumerate(shifts):
        result = simulate_schedule(alpha=alpha, level=level, nights=nights, per_night=per_night, shift=shift,
                                   repetitions=repetitions, seed=seed + i)
        for rule, first in result.items():
            hits = int((first > 0).sum())
            tail = (1 - confidence) / 2
            low = float(beta.ppf(tail, hits, repetitions - hits + 1)) if hits else 0.0
            high = float(beta.ppf(1 - tail, hits + 1, repetitions - hits)) if hits < repetitions else 1.0
            delays = first[first > 0]
            rows.append({"shift": shift, "rule": rule, "alarm_rate": hits / repetitions, "ci_low": low,
                         "ci_high": high, "median_night": float(np.median(delays)) if delays.size else float("nan"),
                         "p90_night": float(np.quantile(delays, 0.9)) if delays.size else float("nan"),
                         "repetitions": repetitions})
    return rows
