"""Cascades and the estimator choice: the counts along a path against a brute force, the certified thresholds
against the counts they claim, the single-model path against `calibrate`, validity by simulation, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.cascades import (
    SINGLE_SHARE,
    _thresholds,
    answering_model,
    calibrate_cascade,
    cascade_counts,
    choose_estimator,
    default_paths,
)


def two_models(rng: np.random.Generator, n: int, decimals: int | None = None) -> tuple[list[np.ndarray],
                                                                                       list[np.ndarray]]:
    d = rng.random(n)
    probs = [0.03 + 0.7 * d ** 2, 0.02 + 0.25 * d]
    scores = [p + s * rng.normal(size=n) for p, s in zip(probs, (0.08, 0.05), strict=True)]
    if decimals is not None:
        scores = [np.round(u, decimals) for u in scores]
    return scores, [(rng.random(n) < p).astype(int) for p in probs]


@pytest.mark.parametrize("decimals", [None, 1])
def test_counts_along_a_path_are_what_the_thresholds_at_each_level_accept(decimals: int | None) -> None:
    rng = np.random.default_rng(3)
    scores, errors = two_models(rng, 400, decimals)
    for path in ((1.0, 1.0), (0.25, 1.0), (1.0, 0.0), (0.0, 1.0)):
        q, n, fd = cascade_counts(scores, errors, path)
        assert np.all(np.diff(q) > 0) and np.all(np.diff(n) >= 0)
        for at in rng.integers(0, q.shape[0], 25):
            answering = answering_model(scores, _thresholds(scores, path, float(q[at])))
            wrong = np.where(answering == 0, errors[0], np.where(answering == 1, errors[1], 0))
            assert (answering < 2).sum() == n[at] and wrong.sum() == fd[at], (path, at)


def test_a_certified_cascade_accepts_what_it_reports_and_the_second_model_is_asked_only_when_needed() -> None:
    rng = np.random.default_rng(5)
    scores, errors = two_models(rng, 2000)
    result = calibrate_cascade(scores, errors, alpha=0.1, models=("small", "big"), costs=(1.0, 10.0),
                               paths=[(1.0, 1.0)])  # both models answer on this path
    assert result.certified and 0 < result.coverage < 1 and 0 < result.shares[0] < result.coverage
    answering = answering_model(scores, result.thresholds)
    wrong = np.where(answering == 0, errors[0], np.where(answering == 1, errors[1], 0))
    assert (answering < 2).sum() == result.n_accepted and wrong.sum() == result.n_errors
    assert result.bound_value <= 0.1 and result.shares == pytest.approx(
        (np.mean(answering == 0), np.mean(answering == 1)))
    first = int(np.flatnonzero(answering == 0)[0])
    assert result.route([float(scores[0][first]), None]) == 0  # answered by the first: the second never asked
    assert result.cost_per_question == pytest.approx(1.0 + 10.0 * (1 - result.shares[0]))
    assert "small when score <=" in result.summary() and "answers" in result.summary()


def test_the_single_model_path_is_calibrate_at_its_share_of_delta() -> None:
    rng = np.random.default_rng(8)
    scores, errors = two_models(rng, 1500)
    result = calibrate_cascade(scores, errors, alpha=0.15, paths=[(0.0, 1.0), (1.0, 1.0)])
    alone = cic.calibrate(scores[1], errors[1], alpha=0.15, delta=0.025)
    only_big = calibrate_cascade(scores, errors, alpha=0.15, delta=0.025, paths=[(0.0, 1.0)])
    assert only_big.thresholds == (None, alone.threshold) and only_big.n_accepted == alone.n_accepted
    assert result.n_accepted >= only_big.n_accepted  # the most coverage over the paths


@pytest.mark.slow
def test_the_cascade_keeps_its_system_risk_below_alpha_where_chaining_single_gates_does_not() -> None:
    """300 draws of 1,000 questions, alpha = 0.15: true system risk from 200,000 fresh questions."""
    rng = np.random.default_rng(11)
    d = rng.random(200_000)
    probs = [0.03 + 0.7 * d ** 2, 0.02 + 0.25 * d]
    pop = [p + s * rng.normal(size=d.shape[0]) for p, s in zip(probs, (0.08, 0.05), strict=True)]

    def risk(thresholds: tuple[float | None, ...]) -> float:
        answering = answering_model(pop, thresholds)
        answered = answering < 2
        return float(np.choose(np.minimum(answering, 1), probs)[answered].mean()) if answered.any() else 0.0

    cascade_bad = naive_bad = 0
    for _ in range(300):
        scores, errors = two_models(rng, 1000)
        cascade_bad += risk(calibrate_cascade(scores, errors, alpha=0.15).thresholds) > 0.15
        naive = tuple(cic.calibrate(u, e, alpha=0.15, keep_table=False).threshold
                      for u, e in zip(scores, errors, strict=True))
        naive_bad += risk(naive) > 0.15
    assert cic.stats.simulation.binomial_ci(cascade_bad, 300)[0] <= 0.05, cascade_bad
    assert naive_bad / 300 > 0.2, naive_bad  # each model's gate holds alone; the chained system does not


def test_choose_estimator_certifies_each_at_its_share_and_picks_the_widest() -> None:
    rng = np.random.default_rng(2)
    scores, errors = two_models(rng, 1500)
    tables = {"good": (scores[1], errors[1]), "noisy": (scores[1] + 0.3 * rng.normal(size=1500), errors[1])}
    chosen = choose_estimator(tables, alpha=0.15)
    for name, (u, e) in tables.items():
        assert chosen.results[name] == cic.calibrate(u, e, alpha=0.15, delta=0.025, keep_table=False)
    best = max((k for k in tables if chosen.results[k].threshold is not None),
               key=lambda k: chosen.results[k].n_accepted)
    assert chosen.estimator == best and "delta / 2" in chosen.guarantee


def test_a_cost_per_question_counts_only_the_questions_that_reach_the_stage() -> None:
    """An adaptive second stage costs what it drew on each question it is asked: the cascade's cost is the mean
    over questions of that, and a constant array costs what the same number does."""
    rng = np.random.default_rng(5)
    scores, errors = two_models(rng, 2000)
    drawn = rng.integers(3, 12, 2000).astype(float)
    result = calibrate_cascade(scores, errors, alpha=0.1, costs=(1.0, drawn), paths=[(1.0, 1.0)])
    asked = answering_model(scores, result.thresholds) != 0
    assert result.certified and 0 < asked.mean() < 1
    assert result.cost_per_question == pytest.approx(1.0 + float(np.mean(np.where(asked, drawn, 0.0))))
    flat = calibrate_cascade(scores, errors, alpha=0.1, costs=(1.0, np.full(2000, 10.0)), paths=[(1.0, 1.0)])
    same = calibrate_cascade(scores, errors, alpha=0.1, costs=(1.0, 10.0), paths=[(1.0, 1.0)])
    assert flat.cost_per_question == pytest.approx(same.cost_per_question)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scores": [np.zeros(5)], "errors": [np.zeros(5)]}, "at least two models"),
    ({"scores": [np.zeros(5), np.zeros(4)], "errors": [np.zeros(5), np.zeros(4)]}, "model 2: scores and errors"),
    ({"scores": [np.zeros(5), np.zeros(5)], "errors": [np.zeros(5), np.full(5, 2)]}, "model 2: errors must be"),
    ({"scores": [np.zeros(5), np.full(5, np.nan)], "errors": [np.zeros(5)] * 2}, "model 2: scores must be finite"),
    ({"scores": [np.zeros(5)] * 2, "errors": [np.zeros(5)] * 2, "costs": [1.0]}, "costs = \\[1.0\\]: one per model"),
    ({"scores": [np.zeros(5)] * 2, "errors": [np.zeros(5)] * 2, "costs": [1.0, np.ones(4)]}, "costs\\[1\\]: must be"),
    ({"scores": [np.zeros(5)] * 2, "errors": [np.zeros(5)] * 2, "costs": [-1.0, 2.0]}, "costs\\[0\\]: must be"),
])
def test_bad_input_is_one_line_naming_the_model_or_field(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        calibrate_cascade(alpha=0.1, **kwargs)
    with pytest.raises(UserError, match="alpha"):
        calibrate_cascade([np.zeros(5)] * 2, [np.zeros(5)] * 2, alpha=1.5)


def test_every_path_is_searched_at_its_share_of_delta_so_the_union_over_paths_holds_at_delta() -> None:
    """Each default path is certified at its share of delta and the shares sum to delta (Bonferroni over the
    paths): the cascade picked is exactly what its own path alone certifies at its share — not at delta, which
    certifies more."""
    rng = np.random.default_rng(11)
    n = 3000
    u1, u2 = rng.random(n), rng.random(n)
    e1 = (rng.random(n) < 0.02 + 0.4 * u1).astype(int)
    e2 = (rng.random(n) < 0.01 + 0.3 * u2).astype(int)
    for k in (2, 3, 4):
        assert math.isclose(sum(share for _, share in default_paths(k, 0.05)), 0.05)
    picked = calibrate_cascade([u1, u2], [e1, e2], alpha=0.12, delta=0.05)
    share = dict(default_paths(2, 0.05))[picked.path]
    assert picked.path_delta == share < 0.05
    alone = calibrate_cascade([u1, u2], [e1, e2], alpha=0.12, delta=share, paths=[picked.path])
    at_full = calibrate_cascade([u1, u2], [e1, e2], alpha=0.12, delta=0.05, paths=[picked.path])
    assert picked.certified
    assert (picked.thresholds, picked.n_accepted) == (alone.thresholds, alone.n_accepted)
    assert at_full.n_accepted > picked.n_accepted  # delta itself would certify more: the split is what holds it


def test_each_model_alone_and_every_skip_is_a_default_path_for_any_number_of_models() -> None:
    """With three models the last one alone, the middle one alone and the first handing over to the last
    (skipping the middle) are candidates; each model alone gets SINGLE_SHARE of delta between them."""
    for k in (2, 3, 4):
        shares = dict(default_paths(k, 0.05))
        for i in range(k):
            alone = tuple(1.0 if j == i else 0.0 for j in range(k))
            assert math.isclose(shares[alone], 0.05 * SINGLE_SHARE / k)
    three = dict(default_paths(3, 0.05))
    assert (1.0, 0.0, 1.0) in three and (0.5, 0.0, 1.0) in three and (0.0, 1.0, 1.0) in three
    rng = np.random.default_rng(3)
    n = 2000
    u = [rng.random(n) for _ in range(3)]
    e = [np.ones(n, dtype=int), np.ones(n, dtype=int), (rng.random(n) < 0.02 + 0.2 * u[2]).astype(int)]
    result = calibrate_cascade(u, e, alpha=0.1)  # only the last model is ever right: it must answer alone
    assert result.certified and result.thresholds[:2] == (None, None) and result.path == (0.0, 0.0, 1.0)


@pytest.mark.parametrize("paths", [[(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)],
                                   [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.5, 1.0), (1.0, 0.5)]])
def test_paths_a_caller_gives_are_each_searched_at_delta_over_their_number(paths: list[tuple[float, ...]]) -> None:
    """P caller-given paths share delta equally: each at delta / P (a union bound over what is searched), so the
    certified cascade is what its own path certifies at delta / P — never at delta."""
    rng = np.random.default_rng(5)
    u1, u2 = rng.random(2000), rng.random(2000)
    e1, e2 = (rng.random(2000) < 0.3 * u1).astype(int), (rng.random(2000) < 0.25 * u2).astype(int)
    picked = calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, delta=0.05, paths=paths)
    assert picked.path_delta == pytest.approx(0.05 / len(paths))


def test_paths_with_their_own_shares_are_searched_at_them_and_may_not_sum_past_delta() -> None:
    """(weights, share) pairs: each path certified at its own share; shares summing past delta are refused (the
    union bound would not hold), as are a mixture of the two forms and a share that is not positive."""
    rng = np.random.default_rng(6)
    u1, u2 = rng.random(2000), rng.random(2000)
    e1, e2 = (rng.random(2000) < 0.3 * u1).astype(int), (rng.random(2000) < 0.25 * u2).astype(int)
    picked = calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, paths=[((0.0, 1.0), 0.04), ((1.0, 1.0), 0.01)])
    alone = calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, delta=dict([((0.0, 1.0), 0.04), ((1.0, 1.0), 0.01)])[
        picked.path], paths=[picked.path])
    assert picked.certified and (picked.thresholds, picked.n_accepted) == (alone.thresholds, alone.n_accepted)
    for paths, says in (([((0.0, 1.0), 0.04), ((1.0, 1.0), 0.02)], "shares sum to 0.06 > delta = 0.05"),
                        ([((0.0, 1.0), 0.04), (1.0, 1.0)], "not a mixture"),
                        ([((0.0, 1.0), 0.0)], "each must be a positive number")):
        with pytest.raises(UserError, match=says):
            calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, paths=paths)


def test_a_favoured_model_gets_most_of_delta_alone_and_the_shares_still_sum_to_delta() -> None:
    """favour= puts that model alone at FAVOUR_SHARE of delta and the default paths at the rest (summing to delta,
    for any number of models); "scores" favours the lowest median calibration score without reading a label."""
    from cic.stats.cascades import FAVOUR_SHARE, favoured_paths, favourite

    for k in (2, 3, 4):
        for i in range(k):
            shares = dict(favoured_paths(k, 0.05, i))
            alone = tuple(1.0 if j == i else 0.0 for j in range(k))
            assert math.isclose(sum(shares.values()), 0.05) and shares[alone] >= 0.05 * FAVOUR_SHARE
    rng = np.random.default_rng(8)
    u1, u2 = rng.random(3000) + 0.5, rng.random(3000)  # the big model's scores lie lower: "scores" favours it
    e1, e2 = (rng.random(3000) < 0.5).astype(int), (rng.random(3000) < 0.02 + 0.2 * u2).astype(int)
    assert favourite("scores", [u1, u2], ("small", "big")) == 1 == favourite("big", [u1, u2], ("small", "big"))
    favoured = calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, models=("small", "big"), favour="scores")
    alone = cic.calibrate(u2, e2, alpha=0.1, delta=dict(favoured_paths(2, 0.05, 1))[(0.0, 1.0)])
    assert favoured.path == (0.0, 1.0) and favoured.thresholds[1] == alone.threshold
    assert favoured.n_accepted >= calibrate_cascade([u1, u2], [e1, e2], alpha=0.1).n_accepted
    for kwargs, says in (({"favour": "huge"}, "favour = 'huge': not one of"), ({"favour": 5}, "a model index"),
                         ({"favour": 0, "paths": [(1.0, 0.0)]}, "either paths= or favour=")):
        with pytest.raises(UserError, match=says):
            calibrate_cascade([u1, u2], [e1, e2], alpha=0.1, models=("small", "big"), **kwargs)
