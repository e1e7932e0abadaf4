"""Recalibration comparison: threshold and coverage changes, the shift test, unattainable alerts."""

from __future__ import annotations

import numpy as np
import pytest

from cic.stats.drift import compare_calibrations


def test_same_distribution_raises_no_shift() -> None:
    rng = np.random.default_rng(0)
    report = compare_calibrations(rng.random(800), rng.random(800), previous_threshold=0.4, threshold=0.45)
    assert not report.shift_detected and report.ks_p_value > 0.01
    assert report.threshold_change == pytest.approx(0.05)
    assert report.coverage == pytest.approx(0.45, abs=0.05)
    assert report.coverage_change == pytest.approx(0.05, abs=0.03)
    assert report.warnings() == []


def test_shifted_scores_are_flagged() -> None:
    rng = np.random.default_rng(1)
    report = compare_calibrations(rng.random(500), rng.random(500) * 0.5 + 0.45, previous_threshold=0.5,
                                  threshold=0.7)
    assert report.shift_detected and report.ks_statistic > 0.3
    assert any("shifted" in w for w in report.warnings())
    assert report.coverage_previous_threshold == pytest.approx(0.1, abs=0.04)
    assert report.coverage == pytest.approx(0.5, abs=0.06)


def test_alpha_becoming_unattainable_is_the_loudest_warning() -> None:
    rng = np.random.default_rng(2)
    report = compare_calibrations(rng.random(300), rng.random(300), previous_threshold=0.5, threshold=None)
    assert report.became_unattainable and report.alpha_unattainable and report.coverage == 0.0
    assert report.threshold_change is None
    assert report.warnings()[0].startswith("alpha has become unattainable")


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"new_scores\[1\] = nan"):
        compare_calibrations([0.1, 0.2], [0.1, float("nan")], previous_threshold=None, threshold=None)
    with pytest.raises(ValueError, match="shift_p_value = 2"):
        compare_calibrations([0.1], [0.2], previous_threshold=None, threshold=None, shift_p_value=2)
