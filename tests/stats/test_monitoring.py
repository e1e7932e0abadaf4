"""The anytime-valid monitor: its wealth equals a direct product of bets, it is a martingale at p = α (so
Ville's inequality applies), it keeps the false-alarm rate over a year of nightly looks within the level where
the fixed-level nightly test does not, and its lower confidence bound covers the true rate at all times."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binom

from cic.errors import UserError
from cic.stats.monitoring import (
    BET_FRACTIONS,
    MonitorState,
    e_value,
    log_wealth,
    lower_bound,
    schedule_study,
    simulate_schedule,
)


@pytest.mark.parametrize("m", [0.05, 0.1, 0.3])
def test_the_wealth_equals_the_product_of_bets_on_every_short_sequence(m: float) -> None:
    for sequence in itertools.product([0, 1], repeat=6):
        direct = np.mean([np.prod([1 + (c / m) * (x - m) for x in sequence]) for c in BET_FRACTIONS])
        assert np.exp(log_wealth(len(sequence), sum(sequence), m)) == pytest.approx(direct, rel=1e-10)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.25])
def test_at_rate_alpha_the_expected_wealth_is_one_at_every_n(alpha: float) -> None:
    """A martingale with W_0 = 1: E[W_n] = 1 exactly (summed over the binomial law), so Ville's bound holds."""
    for n in (1, 5, 40, 200):
        k = np.arange(n + 1)
        expected = float(np.sum(binom.pmf(k, n, alpha) * np.exp(log_wealth(n, k, alpha))))
        assert expected == pytest.approx(1.0, abs=1e-9)
        below = float(np.sum(binom.pmf(k, n, alpha / 2) * np.exp(log_wealth(n, k, alpha))))
        assert below <= 1.0 + 1e-12  # a rate below alpha: a supermartingale


def test_a_year_of_nightly_looks_keeps_the_level_where_the_fixed_level_test_does_not() -> None:
    result = simulate_schedule(alpha=0.1, level=0.01, shift=0.0, repetitions=1500, seed=3)
    anytime, fixed = (result["anytime"] > 0).mean(), (result["fixed_level"] > 0).mean()
    k = int((result["anytime"] > 0).sum())
    assert k <= binom.ppf(0.999, 1500, 0.01)  # consistent with a rate <= 0.01
    assert fixed > 0.05  # optional stopping: the nightly fixed-level test alarms far above its level
    assert anytime < fixed


def test_a_real_excess_is_detected_and_the_state_accumulates() -> None:
    first = simulate_schedule(alpha=0.1, level=0.01, shift=0.05, repetitions=200, seed=4)["anytime"]
    assert (first > 0).all() and np.median(first) <= 14
    state = MonitorState(alpha=0.1, level=0.01)
    for _ in range(10):
        state = state.update(100, 20)
    assert state.n == 1000 and state.k == 200 and state.alarmed and state.e_value >= 100
    assert 0.1 < state.rate_lower_bound < 0.2
    assert MonitorState(alpha=0.1, level=0.01).update(0, 0).e_value == 1.0
    with pytest.raises(UserError, match="errors = 5, answered = 3"):
        state.update(3, 5)


def test_the_lower_bound_covers_the_true_rate_at_all_times() -> None:
    rng = np.random.default_rng(5)
    rate, level, misses = 0.15, 0.05, 0
    for _ in range(200):
        errors = rng.binomial(50, rate, size=30).cumsum()
        bounds = [lower_bound(50 * (t + 1), int(errors[t]), level) for t in range(30)]
        misses += max(bounds) > rate
    assert misses <= binom.ppf(0.999, 200, level)
    assert lower_bound(0, 0, level) == 0.0 and lower_bound(1000, 500, level) > 0.4
    assert e_value(1000, 500, 0.1) > e_value(1000, 150, 0.1) > e_value(1000, 100, 0.1)


def test_the_study_reports_both_rules_with_intervals() -> None:
    rows = schedule_study(shifts=(0.0, 0.1), repetitions=300, nights=60)
    assert [(r["shift"], r["rule"]) for r in rows] == [(0.0, "anytime"), (0.0, "fixed_level"), (0.1, "anytime"),
                                                        (0.1, "fixed_level")]
    assert all(r["ci_low"] <= r["alarm_rate"] <= r["ci_high"] for r in rows)


def test_an_alarm_stays_raised_when_the_rate_falls_back() -> None:
    """The monitor's alarm is sticky: once the e-value reached 1/level, nights of right answers keep it raised
    (the e-value itself falls back; the alarm does not)."""
    from cic.stats.monitoring import MonitorState

    state = MonitorState(alpha=0.1, level=0.01).update(200, 80)
    assert state.alarmed
    for _ in range(50):
        state = state.update(500, 0)
    assert state.alarmed and state.e_value < 1 / 0.01
