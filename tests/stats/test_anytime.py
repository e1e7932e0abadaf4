"""Anytime-valid certification: the e-process against a direct computation, Ville's bound by simulation on a
stream whose rate sits at alpha, the fixed sequence's prefix rule, and a state that survives a round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cic.errors import UserError
from cic.stats.anytime import CAP, AnytimeState
from cic.stats.simulation import binomial_ci


def direct_wealth(scores: np.ndarray, errors: np.ndarray, t: float, alpha: float) -> tuple[float, bool]:
    """One threshold's log-wealth written out answer by answer (aGRAPA, one pseudo-answer at alpha / 2), and
    whether it ever reached 1/delta at delta = 0.05."""
    n, total, squares, log_w, crossed = 0, 0.0, 0.0, 0.0, False
    for u, z in zip(scores, errors, strict=True):
        if u > t:
            continue
        mean = (total + alpha / 2) / (n + 1)
        second = (squares + (alpha / 2) ** 2) / (n + 1)
        bet = min(max(mean / second, 0.0), CAP / (1 - alpha))
        x = alpha - z
        log_w += math.log1p(bet * x)
        n, total, squares = n + 1, total + x, squares + x * x
        crossed = crossed or log_w >= math.log(20)
    return log_w, crossed


def test_each_thresholds_wealth_is_the_product_written_out(rng: np.random.Generator) -> None:
    scores, errors = rng.random(300), (rng.random(300) < 0.08).astype(int)
    grid = [0.2, 0.5, 0.9]
    state = AnytimeState.start(grid, alpha=0.2)
    state.update(scores[:120], errors[:120])
    state.update(scores[120:], errors[120:])  # in two passes: the same as one
    for j, t in enumerate(grid):
        log_w, crossed = direct_wealth(scores, errors, t, 0.2)
        assert state.log_wealth[j] == pytest.approx(log_w) and bool(state.crossed[j]) == crossed
    assert state.seen == 300 and state.n.tolist() == [int((scores <= t).sum()) for t in grid]


@pytest.mark.slow
def test_a_stream_at_the_boundary_is_ever_certified_in_at_most_delta_of_runs() -> None:
    """Ville's inequality by simulation: error rate exactly alpha for every threshold, 200 answers a run, the
    state read after every answer (a crossing is kept); the share of runs that ever certify anything is not
    significantly above delta (the lower end of its exact 95% interval is <= delta)."""
    rng = np.random.default_rng(7)
    runs, hits = 1000, 0
    for _ in range(runs):
        state = AnytimeState.start([0.5, 1.0], alpha=0.2, delta=0.05)
        state.update(rng.random(200), (rng.random(200) < 0.2).astype(int))
        hits += state.threshold is not None
    low, high = binomial_ci(hits, runs)
    assert low <= 0.05, (hits, runs, low, high)


def test_the_sequence_certifies_a_prefix_and_stops_at_the_first_threshold_not_crossed() -> None:
    rng = np.random.default_rng(3)
    u = rng.random(4000)
    z = (rng.random(4000) < np.where(u < 0.6, 0.02, 0.6)).astype(int)  # good up to 0.6, bad beyond
    state = AnytimeState.start([0.2, 0.4, 0.6, 0.8, 1.0], alpha=0.1)
    state.update(u, z)
    assert state.threshold == 0.6 and state.certified_index == 2 and not state.crossed[3]
    forced = AnytimeState.start([0.2, 0.4], alpha=0.1)
    forced.crossed[:] = [False, True]  # a later threshold crossed, an earlier did not: nothing is certified
    assert forced.threshold is None


def test_a_certification_is_kept_and_the_state_survives_a_round_trip() -> None:
    rng = np.random.default_rng(5)
    state = AnytimeState.start([0.3, 0.6], alpha=0.15)
    state.update(rng.random(3000), (rng.random(3000) < 0.03).astype(int))
    assert state.threshold == 0.6
    state.update(np.full(50, 0.1), np.ones(50, dtype=int))  # a burst of errors afterwards: the monitor's job
    assert state.threshold == 0.6
    again = AnytimeState.from_json(state.to_json())
    assert again.to_json() == state.to_json() and again.threshold == 0.6


def test_a_crossing_of_one_over_delta_is_kept_when_the_wealth_falls_back_below_it() -> None:
    """Ville's inequality bounds P(W ever ≥ 1/δ): a threshold certified once stays certified, even when a later
    run of errors takes its wealth back under 1/δ (a risen rate is the monitor's to catch, not a retraction)."""
    state = AnytimeState.start([0.5], alpha=0.2, delta=0.05)
    state.update(np.full(200, 0.1), np.zeros(200, dtype=int))
    assert state.log_wealth[0] >= math.log(1 / 0.05) and state.threshold == 0.5
    state.update(np.full(600, 0.1), np.ones(600, dtype=int))
    assert state.log_wealth[0] < math.log(1 / 0.05)  # the wealth is back below the level ...
    assert state.crossed[0] and state.threshold == 0.5  # ... and the crossing is kept


@pytest.mark.parametrize(("grid", "words"), [([], "grid is empty"), ([0.5, 0.2], "strictly increasing"),
                                            ([0.1, float("nan")], "finite")])
def test_a_grid_that_cannot_be_a_fixed_sequence_is_refused(grid: list[float], words: str) -> None:
    with pytest.raises(UserError, match=words):
        AnytimeState.start(grid, alpha=0.1)
    with pytest.raises(UserError, match="alpha"):
        AnytimeState.start([0.5], alpha=1.5)


def test_a_threshold_is_certified_exactly_when_its_wealth_reaches_one_over_delta() -> None:
    """The crossing rule itself: fed right answers one at a time, the first threshold crosses on the first answer
    whose wealth reaches 1/δ — never on one whose wealth is still below it (certifying at half the wealth would)."""
    state = AnytimeState.start(np.array([0.5, 1.0]), alpha=0.2, delta=0.05)
    level = np.log(1 / 0.05)
    before = state.log_wealth[0]
    while not state.crossed[0] and state.seen < 500:
        before = state.log_wealth[0]
        state.update([0.1], [0])
        assert state.crossed[0] or state.log_wealth[0] < level
    assert state.crossed[0] and state.log_wealth[0] >= level > before and state.seen > 1
    assert np.log(1 / (2 * 0.05)) <= before  # the step before had already reached half of it
