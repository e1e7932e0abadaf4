"""Monte-Carlo validity: the simulator's machinery, and the guarantees of each search."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import cic
from cic.errors import UserError
from cic.stats import bounds
from cic.stats.simulation import binomial_ci


def test_power_risk_closed_form_matches_sampling() -> None:
    model = cic.PowerRisk(low=0.05, high=0.6, power=2.0)
    u, e = model.sample(np.random.default_rng(0), (1, 400_000))
    for t in (0.2, 0.5, 0.9, 1.0):
        accepted = u[0] <= t
        assert e[0][accepted].mean() == pytest.approx(float(model.selection_risk(np.array(t))), abs=0.004)
    t_star = model.oracle_threshold(0.2)
    assert float(model.selection_risk(np.array(t_star))) == pytest.approx(0.2)
    assert model.oracle_threshold(0.01) is None


def test_single_threshold_violation_rate_matches_the_exact_probability() -> None:
    """With one fixed threshold the violation probability is a finite sum: the simulator must hit it."""
    model, t0, n, alpha, delta = cic.PowerRisk(0.0, 0.3), 0.8, 200, 0.1, 0.3
    risk = float(model.selection_risk(np.array(t0)))  # 0.12 > alpha: every pass is a violation
    kmax = bounds.max_errors("cp", np.arange(n + 1), alpha, delta)
    m = np.arange(n + 1)
    exact = float(np.sum(stats.binom.pmf(m, n, t0) * np.where(kmax >= 0, stats.binom.cdf(kmax, m, risk), 0.0)))
    res = cic.simulate(model, n=n, alpha=alpha, delta=delta, bound="cp", search="bonferroni", grid=[t0],
                       n_trials=4000, seed=1, confidence=0.99)
    assert res.ci_low <= exact <= res.ci_high
    assert 0.05 < exact < delta  # the case is informative: violations are common, yet below delta


@pytest.mark.parametrize("bound", ["cp", "hoeffding_kl"])
@pytest.mark.parametrize("model,alpha", [(cic.PowerRisk(0.0, 0.4), 0.1), (cic.PowerRisk(0.12, 0.12), 0.1),
                                         (cic.PowerRisk(0.02, 0.5, 2.0), 0.15)])
def test_bonferroni_and_fixed_sequence_stay_within_delta(bound: str, model: cic.PowerRisk, alpha: float) -> None:
    grid = cic.uniform_grid(0.05, 1.0, 20)
    for search, kwargs in (("bonferroni", {"grid": grid}), ("fixed_sequence", {}),
                           ("fixed_sequence", {"start": 0.1})):
        res = cic.simulate(model, n=600, alpha=alpha, bound=bound, search=search, n_trials=2000, seed=2,
                           **kwargs)
        assert not res.exceeds_delta, res.summary()
        assert res.violation_rate <= 0.06, res.summary()


def test_paper_search_exceeds_delta_on_a_flat_null() -> None:
    """R(t) = 0.12 > alpha everywhere: every certificate is wrong, and Algorithm 1 issues too many."""
    model = cic.PowerRisk(0.12, 0.12)
    paper = cic.simulate(model, n=1000, alpha=0.1, search="paper", n_trials=2000, seed=0)
    fixed = cic.simulate(model, n=1000, alpha=0.1, search="fixed_sequence", n_trials=2000, seed=0)
    assert paper.exceeds_delta and paper.verdict == "exceeds delta"
    assert fixed.violation_rate < paper.violation_rate and not fixed.exceeds_delta
    assert "exceeds delta" in paper.summary()


def test_simulation_is_deterministic_under_a_seed() -> None:
    a = cic.simulate(n=300, n_trials=500, seed=5)
    assert a == cic.simulate(n=300, n_trials=500, seed=5)
    assert a != cic.simulate(n=300, n_trials=500, seed=6)


def test_binomial_ci_is_exact_clopper_pearson() -> None:
    low, high = binomial_ci(7, 100, 0.95)
    assert low == pytest.approx(stats.beta.ppf(0.025, 7, 94))
    assert high == pytest.approx(stats.beta.ppf(0.975, 8, 93))
    assert binomial_ci(0, 10) [0] == 0.0 and binomial_ci(10, 10)[1] == 1.0


@pytest.mark.parametrize("kwargs,message", [(dict(n=0), "n = 0"), (dict(n_trials=0), "n_trials = 0"),
                                            (dict(alpha=2.0), "alpha = 2.0"), (dict(search="bonferroni"), "grid")])
def test_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        cic.simulate(**kwargs)


def test_power_risk_refuses_impossible_probabilities() -> None:
    with pytest.raises(UserError, match="high = 1.5"):
        cic.PowerRisk(0.0, 1.5)
