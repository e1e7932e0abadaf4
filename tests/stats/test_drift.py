"""Drift tests of a recalibration: the score shift test, the error rate at a live threshold, Holm across them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, ks_2samp

from cic.errors import UserError
from cic.stats.drift import error_rate_test, holm, score_shift_test


def test_score_shift_is_scipys_two_sample_ks() -> None:
    rng = np.random.default_rng(1)
    before, after = rng.random(500), rng.random(400) * 0.5 + 0.45
    test = score_shift_test(before, after)
    expected = ks_2samp(before, after)
    assert test.name == "score_shift" and (test.n_reference, test.n) == (500, 400)
    assert test.statistic == pytest.approx(expected.statistic) and test.p_value == pytest.approx(expected.pvalue)
    assert test.p_value < 1e-10 and "KS = " in test.detail


@pytest.mark.parametrize(("k", "n", "alpha"), [(0, 10, 0.1), (3, 10, 0.1), (30, 100, 0.2), (7, 20, 0.05)])
def test_error_rate_p_value_is_the_exact_one_sided_binomial(k: int, n: int, alpha: float) -> None:
    scores = np.r_[np.linspace(0, 0.5, n), np.linspace(0.6, 1, 15)]      # n answered at threshold 0.5
    errors = np.r_[np.arange(n) < k, np.ones(15, dtype=bool)].astype(int)  # the abstained ones do not count
    test = error_rate_test(scores, errors, threshold=0.5, alpha=alpha)
    assert test.n == n and test.statistic == pytest.approx(k / n)
    assert test.p_value == pytest.approx(binomtest(k, n, alpha, alternative="greater").pvalue, rel=1e-9)


def test_a_gate_that_answers_nothing_new_has_p_one() -> None:
    test = error_rate_test([0.7, 0.8], [1, 1], threshold=0.5, alpha=0.1)
    assert test.n == 0 and test.p_value == 1.0


def test_holm_matches_the_step_down_definition() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 12))
        p = rng.random(m) ** 3
        level = float(rng.choice([0.01, 0.05, 0.1]))
        order = np.argsort(p, kind="stable")
        expected = np.zeros(m, dtype=bool)
        for rank, index in enumerate(order):  # literal Holm: stop at the first p above level / (m - rank)
            if p[index] > level / (m - rank):
                break
            expected[index] = True
        assert (holm(p, level) == expected).all()
        assert holm(p, level).sum() >= (p <= level / m).sum()  # never below Bonferroni


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(UserError, match=r"new_scores\[1\] = nan"):
        score_shift_test([0.1, 0.2], [0.3, float("nan")])
    with pytest.raises(UserError, match="alpha = 1.5"):
        error_rate_test([0.1], [0], threshold=0.5, alpha=1.5)
    with pytest.raises(UserError, match="differ in length"):
        error_rate_test([0.1, 0.2], [0], threshold=0.5, alpha=0.1)
    with pytest.raises(UserError, match="level = 0"):
        holm([0.01], 0)
