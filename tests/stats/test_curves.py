"""Risk–coverage curve and prediction rejection ratio on cases computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from cic.stats.curves import prediction_rejection_ratio, rejection_curve, risk_coverage_curve


def test_risk_coverage_by_hand_with_ties() -> None:
    curve = risk_coverage_curve([0.3, 0.1, 0.3, 0.7], [1, 0, 0, 1])
    assert curve.thresholds.tolist() == [0.1, 0.3, 0.7]
    assert curve.coverage.tolist() == [0.25, 0.75, 1.0]
    assert curve.risk.tolist() == pytest.approx([0.0, 1 / 3, 0.5])
    assert curve.at(0.3) == (0.75, pytest.approx(1 / 3))
    assert curve.at(0.05) == (0.0, 0.0)


def test_prr_is_one_for_a_perfect_ranking_and_minus_one_for_the_reverse() -> None:
    # errors last: kept-error rates 2/4, 1/3, 0, 0 equal the oracle's -> PRR 1
    assert prediction_rejection_ratio([1, 2, 3, 4], [0, 0, 1, 1]) == pytest.approx(1.0)
    # errors first: 2/4, 2/3, 1, 1 -> AUC 0.7917 vs random 0.5 and oracle 0.2083 -> PRR -1
    curve = rejection_curve([1, 2, 3, 4], [1, 1, 0, 0])
    assert curve.uncertainty.tolist() == pytest.approx([0.5, 2 / 3, 1.0, 1.0])
    assert curve.oracle.tolist() == pytest.approx([0.5, 1 / 3, 0.0, 0.0])
    assert curve.random == 0.5
    assert curve.prr == pytest.approx(-1.0)


def test_prr_of_a_constant_score_is_zero_ties_count_in_expectation() -> None:
    assert prediction_rejection_ratio([7, 7, 7, 7, 7], [1, 0, 0, 1, 0]) == pytest.approx(0.0)
    # one tie of two (one wrong, one right) below a wrong answer: kept error after rejecting 1 = 0.5 exactly
    curve = rejection_curve([1, 1, 2], [1, 0, 1])
    assert curve.uncertainty.tolist() == pytest.approx([2 / 3, 0.5, 0.5])


def test_prr_undefined_when_every_answer_agrees() -> None:
    assert prediction_rejection_ratio([0.1, 0.5, 0.9], [0, 0, 0]) is None
    assert prediction_rejection_ratio([0.1, 0.5, 0.9], [1, 1, 1]) is None


def test_better_ranking_gives_higher_prr() -> None:
    rng = np.random.default_rng(0)
    errors = (rng.random(3000) < 0.3).astype(int)
    sharp = errors + rng.normal(0, 0.3, 3000)
    blunt = errors + rng.normal(0, 1.5, 3000)
    assert prediction_rejection_ratio(sharp, errors) > prediction_rejection_ratio(blunt, errors) > 0


def test_auarc_is_the_kept_answers_accuracy_over_rejection_rates() -> None:
    # errors first: kept-error rates 2/4, 2/3, 1, 1 -> kept accuracy 1/2, 1/3, 0, 0 -> AUARC 5/24
    assert rejection_curve([1, 2, 3, 4], [1, 1, 0, 0]).auarc == pytest.approx(5 / 24)
    assert rejection_curve([1, 2, 3, 4], [0, 0, 1, 1]).auarc == pytest.approx((2 / 4 + 2 / 3 + 1 + 1) / 4)


def test_ece_by_hand_and_zero_for_a_confidence_that_is_the_chance_of_being_right() -> None:
    from cic.errors import UserError
    from cic.stats.curves import expected_calibration_error

    # bin [0.8667, 0.9333): confidence 0.9, accuracy 1 (two answers); bin [0.0667, 0.1333): 0.1 vs 0 (one)
    assert expected_calibration_error([0.9, 0.9, 0.1], [1, 1, 0]) == pytest.approx(0.1)
    assert expected_calibration_error([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]) == pytest.approx(0.0)
    assert expected_calibration_error([1.0, 0.0], [1, 0]) == 0.0  # the ends fall in the first and last bins
    rng = np.random.default_rng(0)
    confidence = rng.random(200_000)
    assert expected_calibration_error(confidence, rng.random(200_000) < confidence) < 0.01
    assert expected_calibration_error(confidence, rng.random(200_000) < confidence ** 2) > 0.1
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        expected_calibration_error([1.5], [1])


def test_only_one_minus_a_probability_has_a_confidence() -> None:
    from cic.stats.curves import confidence_of

    assert confidence_of("one_minus_max_prob", [0.25, 1.0]).tolist() == [0.75, 0.0]
    assert confidence_of("one_minus_answer_prob[x]", [0.5]).tolist() == [0.5]
    assert confidence_of("semantic_entropy[embedding:0.9]", [0.5]) is None  # an entropy is not a probability
    assert confidence_of("one_minus_max_prob", [1.5]) is None  # not a probability after all
