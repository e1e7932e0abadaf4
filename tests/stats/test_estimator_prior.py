"""Shares of delta for the estimator choice: uniform without a prior, most of delta on the best-ranked with one,
a caller's own shares refused past delta, and the choice certifying each estimator at exactly its share."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.cascades import certify_system, choose_estimator
from cic.stats.estimator_prior import PRIOR_SHARES, checked_shares, prior_shares, uniform_shares

NAMES = ["a", "b", "c", "d"]


def test_without_a_prior_each_estimator_gets_delta_over_k() -> None:
    assert prior_shares(NAMES, None, 0.05) == prior_shares(NAMES, {}, 0.05) == uniform_shares(NAMES, 0.05)
    assert all(math.isclose(v, 0.0125) for v in uniform_shares(NAMES, 0.05).values())


def test_the_best_ranked_get_most_of_delta_and_the_shares_sum_to_delta() -> None:
    shares = prior_shares(NAMES, {"a": 0.1, "b": 0.4, "c": 0.3}, 0.05)
    assert math.isclose(shares["b"], PRIOR_SHARES[0] * 0.05) and math.isclose(shares["c"], PRIOR_SHARES[1] * 0.05)
    assert all(math.isclose(shares[n], (1 - sum(PRIOR_SHARES)) * 0.05 / 2) for n in ("a", "d"))
    assert math.isclose(sum(shares.values()), 0.05)
    two = prior_shares(["a", "b"], {"a": 0.1, "b": 0.4}, 0.05)  # fewer estimators than ranked shares: scaled
    assert math.isclose(sum(two.values()), 0.05) and two["b"] > two["a"]
    # a tie goes to the first named; an estimator the prior leaves out ranks below every one it names
    assert max(prior_shares(NAMES, {"c": 1.0, "a": 1.0}, 0.05).items(), key=lambda kv: kv[1])[0] == "a"
    assert max(prior_shares(NAMES, {"d": -5.0}, 0.05).items(), key=lambda kv: kv[1])[0] == "d"
    assert prior_shares(["only"], {"only": 0.2}, 0.05) == {"only": 0.05}


@pytest.mark.parametrize("prior, says", [
    ({"a": float("nan")}, "finite number"),
    ({"z": 0.3}, "prior names 'z'"),
])
def test_a_prior_that_cannot_rank_is_refused(prior: dict[str, float], says: str) -> None:
    with pytest.raises(UserError, match=says):
        prior_shares(NAMES, prior, 0.05)
    with pytest.raises(UserError, match="leave nothing for the other 2"):
        prior_shares(NAMES, {"a": 1.0}, 0.05, ranked=(0.5, 0.5))


def test_own_shares_past_delta_or_not_one_each_are_refused() -> None:
    with pytest.raises(UserError, match="sum to 0.06 > delta = 0.05"):
        checked_shares(NAMES, {"a": 0.03, "b": 0.01, "c": 0.01, "d": 0.01}, 0.05)
    with pytest.raises(UserError, match="missing 'd'"):
        checked_shares(NAMES, {"a": 0.01, "b": 0.01, "c": 0.01}, 0.05)
    with pytest.raises(UserError, match="positive"):
        checked_shares(NAMES, {"a": 0.0, "b": 0.01, "c": 0.01, "d": 0.01}, 0.05)
    assert checked_shares(NAMES, {n: 0.0125 for n in NAMES}, 0.05) == {n: 0.0125 for n in NAMES}


def _tables(n: int = 800) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4)
    p = 0.02 + 0.3 * rng.random(n)
    errors = (rng.random(n) < p).astype(int)
    return {name: (p + s * rng.normal(size=n), errors) for name, s in zip(NAMES, (0.4, 0.03, 0.2, 0.3), strict=True)}


def test_the_choice_certifies_each_estimator_at_its_share_and_says_how_delta_was_split() -> None:
    tables = _tables()
    prior = {"a": 0.0, "b": 0.5, "c": 0.2, "d": 0.1}
    chosen = choose_estimator(tables, alpha=0.2, delta=0.05, prior=prior)
    shares = prior_shares(NAMES, prior, 0.05)
    for name, (u, e) in tables.items():
        alone = cic.calibrate(u, e, alpha=0.2, delta=shares[name], keep_table=False)
        assert chosen.results[name].threshold == alone.threshold and chosen.results[name].delta == shares[name]
    assert chosen.estimator == "b"
    assert "ranked on other data (b 0.035, c 0.01, the others 0.0025 each" in chosen.guarantee
    assert "independent of these calibration" in chosen.guarantee
    assert "delta / 4 = 0.0125" in choose_estimator(tables, alpha=0.2, delta=0.05).guarantee
    with pytest.raises(UserError, match="sum to"):
        certify_system({k: ([u], [e]) for k, (u, e) in tables.items()}, alpha=0.2, delta=0.05,
                       shares={n: 0.02 for n in NAMES})
