"""The three limits on coverage (any rule's ceiling, the score's in-sample limit, what is certified) against brute
force, and the labels-needed estimate's behaviour (`cic.stats.limits`)."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.limits import (
    RELIABLE,
    EmpiricalLaw,
    ceiling,
    coverage_limits,
    label_budget,
    labels_needed,
    score_limit,
)


def table(n: int, seed: int, low: float = 0.0, high: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    u = np.round(rng.random(n), 2)  # ties, as real scores have
    return u, (rng.random(n) < low + (high - low) * u).astype(int)


def test_the_ceiling_is_what_a_rule_knowing_every_label_covers() -> None:
    """Accept every right answer, then wrong ones while the error rate stays <= alpha: that share is the ceiling."""
    rng = np.random.default_rng(1)
    for mu, alpha in ((0.3, 0.2), (0.6, 0.1), (0.05, 0.1), (0.9, 0.25)):
        n = 100_000
        wrong = int(mu * n)
        extra = min(wrong, int(alpha * (n - wrong) / (1 - alpha)))  # wrong ones allowed beside n - wrong right
        assert (n - wrong + extra) / n == pytest.approx(ceiling(mu, alpha), abs=1e-4)
        assert ceiling(rng.random() * alpha, alpha) == 1.0  # base error below alpha: everything


def test_the_scores_limit_is_the_best_threshold_in_sample_ties_accepted_together() -> None:
    for seed in range(5):
        u, e = table(300, seed)
        for alpha in (0.05, 0.1, 0.2):
            best = max((float(np.mean(u <= t)) for t in np.unique(u) if e[u <= t].mean() <= alpha), default=0.0)
            assert score_limit(u, e, alpha) == pytest.approx(best)
    assert score_limit([0.1, 0.2, 0.3], [1, 0, 0], 0.2) == 0.0  # the most confident answer is wrong: no threshold


def test_the_empirical_law_is_the_table() -> None:
    u, e = table(200, 3)
    law = EmpiricalLaw(u, e)
    for t in (0.0, 0.31, 0.5, 1.0):
        kept = u <= t
        assert law.acceptance(t) == pytest.approx(kept.mean())
        assert law.selection_risk(t) == pytest.approx(e[kept].mean() if kept.any() else 0.0)
    scores, errors = law.sample(np.random.default_rng(0), (3, 500))
    assert (np.diff(scores, axis=1) >= 0).all()
    pairs = set(zip(u.tolist(), e.tolist(), strict=True))
    assert all((s, x) in pairs for s, x in zip(scores.ravel().tolist(), errors.ravel().tolist(), strict=True))


@pytest.mark.slow  # a few dozen calibrations of up to 4x the table, twice
def test_labels_needed_reads_the_law_not_the_tables_size() -> None:
    """A table repeated twice is the same law: the estimate stays (within the bisection's 5% and the draws'
    noise); a table already certifying at its size needs no more than it has."""
    u, e = table(400, 7, high=0.4)
    once = labels_needed(u, e, alpha=0.1, draws=60)
    twice = labels_needed(np.r_[u, u], np.r_[e, e], alpha=0.1, draws=60)
    assert once is not None and twice is not None and 0.75 <= twice / once <= 1.33
    strong_u, strong_e = table(600, 8, high=0.15)
    assert cic.calibrate(strong_u, strong_e, alpha=0.1).threshold is not None
    assert labels_needed(strong_u, strong_e, alpha=0.1, draws=60) <= 600


def test_the_budget_draws_the_same_law_as_drawing_rows() -> None:
    """Counts per distinct score (multinomial, binomial errors) against whole rows drawn and calibrated by the
    simulator: the share certifying and the coverage agree within their noise."""
    from cic.stats.simulation import simulate

    u, e = table(300, 2, high=0.4)
    fast = label_budget(u, e, alpha=0.07, sizes=[400], draws=400)[0]
    rows = simulate(EmpiricalLaw(u, e), n=400, alpha=0.07, n_trials=400, seed=5)
    share = 1 - rows.fails / 400
    assert 0.1 < share < 0.9 and abs(fast.certified_share - share) < 4 * np.sqrt(share * (1 - share) / 200)
    assert fast.mean_coverage == pytest.approx(rows.mean_coverage, rel=0.25)


def test_more_labels_certify_more_on_the_budget_curve() -> None:
    u, e = table(300, 9, high=0.4)
    points = label_budget(u, e, alpha=0.05, sizes=[300, 1200, 4800], draws=100)
    assert [p.size for p in points] == [300, 1200, 4800]
    assert points[0].certified_share <= points[1].certified_share <= points[2].certified_share
    assert points[2].mean_coverage > points[0].mean_coverage
    with pytest.raises(UserError, match="sizes"):
        label_budget(u, e, alpha=0.05, sizes=[0])


def test_the_verdict_says_why_in_words() -> None:
    u, e = table(300, 4, high=0.4)
    short = coverage_limits(u, e, alpha=0.08, certified=0.0, draws=100)
    assert short.labels_needed is not None and 300 < short.labels_needed <= RELIABLE * 300
    assert f"about {short.labels_needed - 300:,} more labelled answers" in short.sentence()
    assert "any rule's ceiling" in short.sentence() and f"{short.score_limit:.3f}" in short.sentence()
    slow = coverage_limits(*table(300, 4, low=0.06, high=0.3), alpha=0.1, certified=0.0, draws=100)
    assert slow.score_limit > 0 and slow.labels_needed is None  # needs more than RELIABLE x: no number
    assert "more than 600 more (over 3x these 300)" in slow.sentence() and "cannot be read" in slow.sentence()
    hopeless = coverage_limits(u, np.where(u <= 0.05, 1, e), alpha=0.05, certified=0.0, draws=100)
    assert hopeless.labels_needed is None and "more labels will not help" in hopeless.sentence()
    fine = coverage_limits(u, e, alpha=0.2, certified=0.4, draws=100)
    assert fine.labels_needed is None and fine.sentence().startswith("certified 0.400 of questions")


def test_an_estimate_below_the_tables_size_says_unlucky_not_zero_more() -> None:
    from cic.stats.limits import CoverageLimits

    verdict = CoverageLimits(alpha=0.1, n=1000, base_error=0.2, ceiling=0.9, score_limit=0.3, certified=0.0,
                             labels_needed=800).sentence()
    assert "an unlucky draw" in verdict and "about 800 labels reach alpha = 0.1" in verdict
    assert "more labelled answers" not in verdict


def test_labels_stop_paying_where_a_doubling_adds_under_a_hundredth() -> None:
    from cic.stats.limits import stops_paying

    assert stops_paying([100, 200, 400, 800], [0.0, 0.2, 0.205, 0.3]) == 200  # the first flat doubling, once certified
    assert stops_paying([100, 200, 400], [0.0, 0.0, 0.0]) is None  # nothing certified at any size
    assert stops_paying([100, 200, 400], [0.1, 0.2, 0.3]) is None  # every doubling still pays
