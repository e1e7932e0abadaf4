"""The judge-plus-people certificate (`cic.stats.judged`, `cic.calibrate_judged`): the people's correction bounds
what it claims, a judge's bias is corrected rather than trusted, and the betting order never follows the scores."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.judged import Rectifier


def _rectifier(d: np.ndarray) -> Rectifier:
    """A rectifier over people-labelled questions whose H - J is `d` (judge 0 or 1 to make it so)."""
    judge = (d < 0).astype(int)
    human = (d > 0).astype(float) + judge * (d == 0)
    return Rectifier.build(np.arange(d.shape[0], dtype=float), judge, human)


def test_rectifier_bound_covers_the_mean_at_its_level() -> None:
    """At level 0.1 the bound falls below the true E[H - J] in at most about 10% of draws (here a skewed law whose
    mean is -0.06); a bound that dropped the scale back from x to H - J, or bet the wrong way, misses far more."""
    rng = np.random.default_rng(0)
    values, probs = np.array([-1, 0, 1]), np.array([0.12, 0.82, 0.06])
    mean = float(values @ probs)
    misses = 0
    for _ in range(300):
        d = rng.choice(values, size=60, p=probs)
        misses += _rectifier(d).upper(np.array([60]), 0.1)[0] < mean
    assert misses <= 0.1 * 300 + 3 * np.sqrt(300 * 0.09), misses
    assert misses >= 1  # not vacuous: the bound is tight enough to miss sometimes


def test_rectifier_bound_is_tight_when_judge_and_people_agree() -> None:
    """No disagreement among 400 labelled answers: the correction bound is small (well under the 0.06 a range-2
    Hoeffding bound would give), and it is 1 where nobody labelled an accepted answer."""
    rect = _rectifier(np.zeros(400, dtype=int))
    bound = rect.upper(np.array([0, 400]), 0.05)
    assert bound[0] == 1.0 and 0 < bound[1] < 0.03
    # on the scale of H - J: a judge missing every error the people saw leaves a correction of 1, bounded by 1
    assert _rectifier(np.ones(50, dtype=int)).upper(np.array([50]), 0.05)[0] >= 0.999


def test_betting_order_is_not_the_score_order() -> None:
    """The people's answers enter the bets in a fixed pseudo-random order, not by score (a score order would make
    the bets' conditional means drift and void Ville's inequality)."""
    rect = _rectifier(np.zeros(200, dtype=int))
    assert sorted(rect.rank.tolist()) == list(range(200)) and not np.all(np.diff(rect.rank) > 0)


def test_with_ids_the_result_does_not_depend_on_the_row_order() -> None:
    """The people's labels are bet on in the order of their ids' hashes: the same questions sorted by score, by id
    or shuffled certify the same threshold (a store and a file of the same table agree)."""
    rng = np.random.default_rng(4)
    s = rng.random(1500)
    wrong = (rng.random(1500) < 0.3 * s).astype(int)
    judge = np.where(rng.random(1500) < 0.95, wrong, 1 - wrong)
    human = np.where(rng.random(1500) < 0.3, wrong, np.nan)
    ids = np.array([f"q{i}" for i in range(1500)])
    results = set()
    for order in (np.arange(1500), np.argsort(s), rng.permutation(1500)):
        r = cic.calibrate_judged(s[order], judge[order], human[order], alpha=0.2, ids=ids[order].tolist())
        results.add((r.threshold, r.bound_value))
    assert len(results) == 1 and next(iter(results))[0] is not None


def test_a_judge_that_misses_every_error_is_corrected_not_trusted() -> None:
    """A judge calling every answer right, errors at 30% everywhere: certified on the judge alone alpha = 0.1
    would accept everything; with people's correction nothing is certified."""
    rng = np.random.default_rng(1)
    s = rng.random(2000)
    wrong = (rng.random(2000) < 0.3).astype(int)
    human = np.where(np.arange(2000) < 400, wrong, np.nan)
    assert cic.calibrate(s, np.zeros(2000), alpha=0.1).threshold == s.max()
    assert cic.calibrate_judged(s, np.zeros(2000), human, alpha=0.1).threshold is None


def test_violations_stay_rare_with_a_judge_lenient_where_the_score_is_high() -> None:
    """40 calibration sets, a judge missing errors more often the higher the score: the people's true risk at the
    certified threshold exceeds alpha in at most 4 (delta = 0.05); the judge alone as truth exceeds it in most."""
    law = cic.PowerRisk(0.0, 0.6, 1.0)
    rng = np.random.default_rng(2)
    judged_bad = alone_bad = certified = 0
    for _ in range(40):
        u = rng.random(1200)
        wrong = (rng.random(1200) < law.conditional_risk(u)).astype(int)
        judge = np.where(wrong == 1, (rng.random(1200) >= 0.8 * u).astype(int), 0)
        human = np.where(rng.permutation(1200) < 400, wrong, np.nan)
        t = cic.calibrate_judged(u, judge, human, alpha=0.2).threshold
        certified += t is not None
        judged_bad += t is not None and law.selection_risk(np.array(t)) > 0.2
        j = cic.calibrate(u, judge, alpha=0.2).threshold
        alone_bad += j is not None and law.selection_risk(np.array(j)) > 0.2
    assert judged_bad <= 4 and certified >= 20 and alone_bad >= 20, (judged_bad, certified, alone_bad)


def test_result_states_people_counts_and_label_assumption() -> None:
    rng = np.random.default_rng(3)
    s = rng.random(3000)
    wrong = rng.random(3000) < 0.25 * s
    human = np.where(np.arange(3000) < 1000, wrong, np.nan)
    r = cic.calibrate_judged(s, wrong, human, alpha=0.15)  # a judge that agrees everywhere
    assert r.feasible and r.n_human == 1000 and 0 < r.n_human_accepted <= 1000
    assert r.bound_value is not None and r.bound_value <= 0.15
    assert "people a subset chosen at random" in r.summary() and "people a subset chosen at random" in r.guarantee
    meta = r.gate().metadata
    assert meta["labels"] == "judge+people" and meta["n_human"] == 1000
    assert "labels" not in cic.calibrate(s, wrong, alpha=0.15).gate().metadata  # one kind of label: as before
    assert cic.CalibrationResult.from_json(r.to_json()).n_human_accepted == r.n_human_accepted
    with pytest.raises(UserError, match="no binomial|none"):
        r.table()
    refused = cic.calibrate_judged(s, wrong, human, alpha=0.15, min_coverage=0.99)
    assert refused.refused and refused.threshold is None


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"judge": np.zeros(5)}, "judge: has 5 values for 10 scores"),
    ({"human": np.full(10, 2.0)}, r"human\[0\] = 2.0: human errors must be 0/1"),
    ({"human": np.full(10, np.nan)}, "no question carries a human label"),
    ({"judge_share": 1.5}, "judge_share = 1.5"),
    ({"search": "lec"}, "search = 'lec': a judge-plus-people certificate needs"),
])
def test_bad_input_names_the_argument(kwargs: dict, says: str) -> None:
    args = {"scores": np.linspace(0, 1, 10), "judge": np.zeros(10), "human": np.r_[np.zeros(5), np.full(5, np.nan)]}
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(UserError, match=says):
        cic.calibrate_judged(args["scores"], args["judge"], args["human"], alpha=0.2, **rest)
