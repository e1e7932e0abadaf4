"""The coverage certificate (`cic.stats.coverage`): the DKW–Massart margin, the bound a result carries, the refusal
below `min_coverage`, and — in simulation — that the bound holds at the threshold the search picked."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.calibration import CalibrationResult
from cic.stats.coverage import coverage_claim, coverage_lcb, coverage_margin
from cic.stats.simulation import PowerRisk


def test_the_margin_is_massarts_one_sided_constant_and_two_sided_above_one_half() -> None:
    assert coverage_margin(1000, 0.05) == pytest.approx(math.sqrt(math.log(20) / 2000))
    assert coverage_margin(1000, 0.8) == pytest.approx(math.sqrt(math.log(2 / 0.8) / 2000))
    assert coverage_margin(4000, 0.05) == pytest.approx(coverage_margin(1000, 0.05) / 2)
    with pytest.raises(UserError, match="n = 0"):
        coverage_margin(0, 0.05)


def test_the_bound_is_the_calibration_share_less_the_margin_floored_at_zero() -> None:
    assert coverage_lcb(400, 1000, 0.05) == pytest.approx(0.4 - coverage_margin(1000, 0.05))
    assert coverage_lcb(10, 1000, 0.05) == 0.0
    assert coverage_lcb(0, 1000, 0.05) == 0.0
    assert "with probability >= 0.9)" in coverage_claim(0.3, 0.05)  # both claims at once: a union bound


def test_every_result_carries_its_bound_and_says_it() -> None:
    u = np.linspace(0, 1, 1000)
    e = (np.random.default_rng(0).random(1000) < 0.4 * u).astype(int)
    result = cic.calibrate(u, e, alpha=0.1)
    assert result.coverage_lcb == pytest.approx(coverage_lcb(result.n_accepted, 1000, 0.05))
    assert result.summary().endswith(f"; answers >= {result.coverage_lcb:.3f} of questions with probability >= 0.95")
    assert result.gate().metadata["coverage_lcb"] == result.coverage_lcb
    assert CalibrationResult.from_json(result.to_json()) == result
    assert cic.calibrate(u, np.ones(1000), alpha=0.1).coverage_lcb is None  # nothing certified: nothing to bound


def test_a_gate_below_min_coverage_is_refused_and_one_at_it_is_kept() -> None:
    u = np.linspace(0, 1, 1000)
    e = (np.random.default_rng(0).random(1000) < 0.4 * u).astype(int)
    lcb = cic.calibrate(u, e, alpha=0.1).coverage_lcb
    assert lcb is not None and lcb > 0.2
    kept = cic.calibrate(u, e, alpha=0.1, min_coverage=lcb)
    refused = cic.calibrate(u, e, alpha=0.1, min_coverage=lcb + 1e-9)
    assert kept.feasible and not kept.refused
    assert not refused.feasible and refused.refused and refused.coverage_lcb == lcb
    assert refused.gate().decide(0.0) == "abstain" and refused.n_accepted == 0
    assert "below min coverage" in refused.summary() and "refused, abstain on everything" in refused.summary()
    with pytest.raises(UserError, match="min_coverage = 1.5"):
        cic.calibrate(u, e, alpha=0.1, min_coverage=1.5)


def test_the_bound_holds_at_the_picked_threshold_in_simulation() -> None:
    """The selected threshold's true coverage pi(t) falls below the bound in at most delta of calibration sets
    (with room for Monte-Carlo error); at delta = 0.5 the bound is loose enough to see it bite."""
    law = PowerRisk(0.0, 0.5, 1.0)
    rng = np.random.default_rng(1)
    for delta in (0.05, 0.5):
        misses = 0
        for _ in range(400):
            u, e = law.sample(rng, (1, 500))
            result = cic.calibrate(u[0], e[0], alpha=0.15, delta=delta)
            if result.feasible:
                misses += float(law.acceptance(np.array(result.threshold))) < result.coverage_lcb
        assert misses / 400 <= delta + 0.03, (delta, misses)
