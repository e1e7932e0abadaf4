"""calibrate(): hand-computed cases, agreement with literal loops, the result object and input checks."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy import stats

import cic
from cic.errors import UserError
from cic.stats import bounds
from tests.support import reference
from tests.support.tables import make_table


def test_all_correct_answers() -> None:
    scores = np.arange(1.0, 11.0)
    errors = np.zeros(10, dtype=int)
    # CP with FD = 0: B = 1 - 0.05^(1/n); n = 10 gives 0.259 <= 0.3, so every answer is accepted.
    res = cic.calibrate(scores, errors, alpha=0.3, bound="cp", search="paper")
    assert res.threshold == 10.0 and res.n_accepted == 10 and res.n_errors == 0
    assert res.bound_value == pytest.approx(1 - 0.05 ** 0.1)
    # Hoeffding: sqrt(log 20 / 20) = 0.387 > 0.3 even at n = 10: unattainable.
    assert cic.calibrate(scores, errors, alpha=0.3, bound="hoeffding", search="paper").threshold is None


def test_all_wrong_answers_are_never_certified() -> None:
    res = cic.calibrate(np.linspace(0, 1, 50), np.ones(50), alpha=0.25, search="paper")
    assert res.threshold is None and not res.feasible and res.bound_value is None
    assert res.n_accepted == 0 and "unattainable" in res.summary()


def test_single_item() -> None:
    assert cic.calibrate([0.3], [0], alpha=0.97, search="paper").threshold == 0.3  # B_CP(0, 1) = 0.95
    assert cic.calibrate([0.3], [0], alpha=0.9, search="paper").threshold is None


def test_ties_accept_every_equal_score() -> None:
    scores = np.array([0.2] * 5 + [0.5] * 40)
    errors = np.zeros(45, dtype=int)
    errors[[5, 44]] = 1  # two wrong answers at the tied score 0.5, one at each end of the run
    res = cic.calibrate(scores, errors, alpha=0.2, search="paper")
    table = res.table()
    assert table["threshold"].to_list() == [0.2, 0.5]
    assert table["n_accepted"].to_list() == [5, 45]
    assert table["n_errors"].to_list() == [0, 2]
    assert res.threshold == 0.5 and res.n_accepted == 45 and res.n_errors == 2
    assert res.bound_value == pytest.approx(stats.beta.ppf(0.95, 3, 43))


def test_hand_computed_small_case() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    errors = np.array([0, 0, 0, 0, 1, 1])
    # n = 4, FD = 0: B_CP = 1 - 0.1^(1/4) = 0.4377 at delta = 0.1; n = 5, FD = 1: beta.ppf(.9, 2, 4) = 0.5839
    res = cic.calibrate(scores, errors, alpha=0.5, delta=0.1, search="paper")
    assert res.threshold == 0.4
    assert res.bound_value == pytest.approx(1 - 0.1 ** 0.25)


@pytest.mark.parametrize("bound", ["hoeffding", "cp"])
def test_paper_search_equals_literal_algorithm_1(bound: str) -> None:
    rng = np.random.default_rng(7)
    for case in range(250):
        n = int(rng.integers(1, 160))
        scores, errors = make_table(rng, n, decimals=int(rng.integers(1, 4)), slope=float(rng.uniform(0, 0.8)),
                                    base=float(rng.uniform(0, 0.2)))
        alpha = float(rng.choice([0.05, 0.1, 0.15, 0.2, 0.25, 0.4]))
        delta = float(rng.choice([0.01, 0.05, 0.1]))
        got = cic.calibrate(scores, errors, alpha=alpha, delta=delta, bound=bound, search="paper").threshold
        assert got == reference.algorithm1(scores, errors, alpha, delta, bound), case


@pytest.mark.parametrize("bound", ["hoeffding_kl", "bentkus", "hoeffding_bentkus"])
def test_paper_search_with_extra_bounds_equals_literal_loop(bound: str) -> None:
    rng = np.random.default_rng(8)
    for case in range(25):
        scores, errors = make_table(rng, int(rng.integers(1, 150)))
        got = cic.calibrate(scores, errors, alpha=0.2, bound=bound, search="paper").threshold
        assert got == reference.algorithm1(scores, errors, 0.2, 0.05, bound), case


def test_negative_and_tied_scores_take_the_general_path() -> None:
    rng = np.random.default_rng(9)
    for case in range(100):
        n = int(rng.integers(1, 120))
        scores = np.round(rng.normal(size=n), int(rng.integers(0, 3)))
        scores[rng.random(n) < 0.1] = -0.0
        errors = (rng.random(n) < 0.15).astype(int)
        got = cic.calibrate(scores, errors, alpha=0.3, bound="cp", search="paper").threshold
        assert got == reference.algorithm1(scores, errors, 0.3, 0.05, "cp"), case


def test_large_input_matches_a_direct_scan() -> None:
    rng = np.random.default_rng(10)
    scores, errors = make_table(rng, 200_000, decimals=None, slope=0.3, base=0.0)
    res = cic.calibrate(scores, errors, alpha=0.1, search="paper")
    table = res.table()  # rebuilt from the kept data by a full sort
    ok = np.asarray(bounds.feasible("cp", table["n_errors"].to_numpy(), table["n_accepted"].to_numpy(), 0.1, 0.05))
    assert res.threshold == table["threshold"][int(np.flatnonzero(ok).max())]
    assert table.filter("selected")["n_accepted"].to_list() == [res.n_accepted]


@pytest.mark.parametrize("bound", ["cp", "hoeffding", "bentkus"])
def test_binned_paper_search_equals_literal_algorithm_1(bound: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The large-input path (bins, then exact search in groups) on small inputs of every awkward shape."""
    from cic.stats import calibration

    monkeypatch.setattr(calibration, "_BINNED_MIN_ITEMS", 1)
    rng = np.random.default_rng(17)
    for case in range(150):
        n = int(rng.integers(1, 250))
        kind = case % 5
        if kind == 0:
            scores, errors = make_table(rng, n, decimals=int(rng.integers(1, 4)))
        elif kind == 1:  # heavy ties at zero (e.g. entropy of unanimous samples) and a long tail
            scores = np.where(rng.random(n) < 0.5, 0.0, rng.exponential(3.0, n))
            errors = (rng.random(n) < np.clip(0.05 + 0.1 * scores, 0, 1)).astype(int)
        elif kind == 2:  # negative scores and one far outlier
            scores = rng.normal(size=n)
            scores[0] = 1e6
            errors = (rng.random(n) < 0.1).astype(int)
        elif kind == 3:  # all scores equal
            scores, errors = np.full(n, 0.7), (rng.random(n) < 0.05).astype(int)
        else:  # error-free low scores then a bad block
            scores = np.sort(rng.random(n))
            errors = (np.arange(n) > 0.6 * n).astype(int)
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.3]))
        got = cic.calibrate(scores, errors, alpha=alpha, bound=bound, search="paper")
        assert got.threshold == reference.algorithm1(scores, errors, alpha, 0.05, bound), case
        if got.feasible:
            assert got.n_accepted == int((scores <= got.threshold).sum())
            assert got.n_errors == int(errors[scores <= got.threshold].sum())


@pytest.mark.parametrize("bound", ["hoeffding", "cp"])
def test_bonferroni_equals_literal_loop_on_a_fixed_grid(bound: str) -> None:
    rng = np.random.default_rng(11)
    grid = cic.uniform_grid(0.0, 1.0, 25)
    for case in range(80):
        scores, errors = make_table(rng, int(rng.integers(5, 400)))
        res = cic.calibrate(scores, errors, alpha=0.2, bound=bound, search="bonferroni", grid=grid)
        assert res.threshold == reference.bonferroni(scores, errors, grid, 0.2, 0.05, bound), case
        assert res.gamma == pytest.approx(0.05 / 25) and res.n_candidates == 25


@pytest.mark.parametrize("bound", ["hoeffding", "cp"])
def test_fixed_sequence_equals_literal_loop(bound: str) -> None:
    rng = np.random.default_rng(12)
    for case in range(120):
        scores, errors = make_table(rng, int(rng.integers(5, 300)), slope=float(rng.uniform(0, 0.6)))
        n_min = int(rng.integers(1, 60))
        res = cic.calibrate(scores, errors, alpha=0.2, bound=bound, search="fixed_sequence", n_min=n_min)
        assert res.threshold == reference.fixed_sequence(scores, errors, 0.2, 0.05, bound, n_min=n_min), case
        start = float(rng.uniform(0, 0.5))
        res = cic.calibrate(scores, errors, alpha=0.2, bound=bound, search="fixed_sequence", start=start)
        assert res.threshold == reference.fixed_sequence(scores, errors, 0.2, 0.05, bound, start=start), case


def test_fixed_sequence_stops_at_the_first_failure_where_paper_search_goes_on() -> None:
    # Risk is low, then a bad patch, then low again: the paper search certifies the far end, fixed
    # sequence stops before the bad patch.
    scores = np.arange(1000) / 1000
    errors = np.zeros(1000, dtype=int)
    errors[100:130] = 1
    fs = cic.calibrate(scores, errors, alpha=0.1, search="fixed_sequence", n_min=40)
    paper = cic.calibrate(scores, errors, alpha=0.1, search="paper")
    assert fs.threshold is not None and paper.threshold is not None
    assert fs.threshold < scores[110] < paper.threshold
    assert fs.n_tested < fs.n_candidates
    tested = fs.table().filter("tested")
    assert tested.height == fs.n_tested and not tested["feasible"][-1]


def test_fixed_sequence_default_start_is_label_free() -> None:
    rng = np.random.default_rng(13)
    scores, errors = make_table(rng, 500)
    res = cic.calibrate(scores, errors, alpha=0.2, search="fixed_sequence")
    assert res.n_min == bounds.half_alpha_n("cp", 0.2, 0.05)


def test_threshold_grows_with_alpha() -> None:
    rng = np.random.default_rng(14)
    scores, errors = make_table(rng, 2000)
    thresholds = [cic.calibrate(scores, errors, alpha=a, search="paper").threshold for a in (0.1, 0.15, 0.2, 0.3, 0.5)]
    finite = [t for t in thresholds if t is not None]
    assert finite == sorted(finite) and len(finite) >= 3


def test_result_object_api() -> None:
    rng = np.random.default_rng(15)
    scores, errors = make_table(rng, 3000)
    res = cic.calibrate(scores, errors, alpha=0.2, delta=0.1, bound="hoeffding", search="paper")
    assert res.feasible and res.alpha == 0.2 and res.delta == 0.1 and res.bound == "hoeffding"
    assert res.search == "paper" and res.n_calibration == 3000
    assert res.bound_value == pytest.approx(reference.literal_ucb("hoeffding", res.n_errors, res.n_accepted, 0.1))
    assert res.bound_value <= 0.2
    assert res.n_accepted == int((scores <= res.threshold).sum())
    assert res.n_errors == int(errors[scores <= res.threshold].sum())
    table = res.table()
    assert table.columns == ["threshold", "n_accepted", "n_errors", "empirical_risk", "ucb", "feasible", "tested",
                             "selected"]
    assert table.height == len(np.unique(scores)) and res.n_candidates is None
    assert table.filter("selected")["threshold"].to_list() == [res.threshold]
    assert table.filter("feasible")["threshold"].max() == res.threshold
    gate = res.gate()
    assert gate.threshold == res.threshold and gate.metadata["alpha"] == 0.2
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.threshold = 1.0  # type: ignore[misc]


def test_json_round_trip() -> None:
    rng = np.random.default_rng(16)
    scores, errors = make_table(rng, 300)
    for res in (cic.calibrate(scores, errors, alpha=0.2, search="paper"),
                cic.calibrate(scores, errors, alpha=0.01, search="paper"),
                cic.calibrate(scores, errors, alpha=0.2, search="fixed_sequence", start=0.1)):
        back = cic.CalibrationResult.from_json(res.to_json())
        assert back == res
        with pytest.raises(UserError, match="include_table"):
            back.table()
        full = cic.CalibrationResult.from_json(res.to_json(include_table=True))
        assert full == res and full.table().equals(res.table())
        assert json.loads(res.to_json())["threshold"] == res.threshold


@pytest.mark.parametrize("text,message", [
    ("not json", "not valid JSON"),
    ('{"kind": "cic.gate", "threshold": 1}', "kind = 'cic.gate'"),
    ('{"kind": "cic.calibration_result", "surprise": 1}', "unknown field"),
])
def test_from_json_rejects_foreign_documents(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        cic.CalibrationResult.from_json(text)


def test_errors_as_booleans_and_floats() -> None:
    scores = np.linspace(0, 1, 100)
    as_int = cic.calibrate(scores, (scores > 0.8).astype(int), alpha=0.1, search="paper")
    assert cic.calibrate(scores, scores > 0.8, alpha=0.1, search="paper") == as_int
    assert cic.calibrate(scores, (scores > 0.8).astype(float), alpha=0.1, search="paper") == as_int


@pytest.mark.parametrize("kwargs,message", [
    (dict(scores=[0.1, float("nan")], errors=[0, 1]), r"scores\[1\] = nan"),
    (dict(scores=[0.1, float("inf")], errors=[0, 1]), r"scores\[1\] = inf"),
    (dict(scores=[0.1, -float("inf")], errors=[0, 1]), r"scores\[1\] = -inf"),
    (dict(scores=[0.1, 0.2], errors=[0, 2]), r"errors\[1\] = 2"),
    (dict(scores=[0.1, 0.2], errors=[0, 0.5]), r"errors\[1\] = 0.5"),
    (dict(scores=[0.1, 0.2], errors=["no", "yes"]), r"errors\[0\] = 'no'"),
    (dict(scores=[0.1, 0.2, 0.3], errors=[0, 1]), "len\\(scores\\) = 3, len\\(errors\\) = 2"),
    (dict(scores=[], errors=[]), "scores is empty"),
    (dict(alpha=0.0), "alpha = 0.0"),
    (dict(alpha=1.0), "alpha = 1.0"),
    (dict(alpha=-0.1), "alpha = -0.1"),
    (dict(delta=1.5), "delta = 1.5"),
    (dict(bound="wilson"), "bound = 'wilson'"),
    (dict(search="greedy"), "search = 'greedy'"),
    (dict(search="bonferroni", grid=[0.1, 0.3, 0.2]), r"grid\[1\] = 0.3 is followed by grid\[2\] = 0.2"),
    (dict(search="bonferroni", grid=[0.1, 0.1]), "strictly increasing"),
    (dict(search="bonferroni"), "needs grid"),
    (dict(search="paper", grid=[0.1, 0.2]), "search = 'paper' scans every unique"),
    (dict(search="paper", n_min=10), "n_min = 10"),
    (dict(search="fixed_sequence", n_min=0), "n_min = 0"),
    (dict(search="fixed_sequence", start=float("nan")), "start = nan"),
])
def test_bad_input_names_the_argument_and_value(kwargs: dict, message: str) -> None:
    args = dict(scores=[0.1, 0.2, 0.3], errors=[0, 0, 1], alpha=0.2)
    args.update(kwargs)
    with pytest.raises(UserError, match=message):
        cic.calibrate(args.pop("scores"), args.pop("errors"), **args)


def test_grid_helpers() -> None:
    np.testing.assert_allclose(cic.uniform_grid(0, 1, 5), [0, 0.25, 0.5, 0.75, 1])
    grid = cic.quantile_grid(np.arange(100.0), 4)
    assert grid.tolist() == sorted(set(grid.tolist())) and len(grid) == 4
    with pytest.raises(UserError, match="low = 1"):
        cic.uniform_grid(1, 0, 5)
    with pytest.raises(UserError, match="k = 0"):
        cic.uniform_grid(0, 1, 0)


@pytest.mark.faults
def test_a_non_numeric_error_value_is_reported_at_its_own_row() -> None:
    errors = ["0", "1"] * 25 + ["yes"] + ["0"] * 10
    with pytest.raises(UserError, match=r"errors\[50\] = 'yes'"):
        cic.calibrate(np.linspace(0, 1, 61), np.array(errors, dtype=object), alpha=0.2)


def test_only_the_paper_search_takes_the_binned_path() -> None:
    """Binning keeps the largest feasible score at one level: right for Algorithm 1 only (a start, a grid or a
    per-test level split would be skipped)."""
    from cic.stats.searches import SEARCH_NAMES, get_search

    assert [name for name in SEARCH_NAMES if get_search(name).bins_large_inputs] == ["paper"]


def test_the_printed_threshold_accepts_exactly_the_calibration_answers_the_certified_one_does() -> None:
    """Six rounded digits could print a rule below the threshold (0.326004 for 0.3260041 drops that answer): the
    printed number is the shortest one at or above it with no calibration score in between."""
    from cic.stats.calibration import exact

    assert exact(0.32600409920846896, below=0.33) == "0.326005"  # rounded up, never down
    assert exact(0.32600409920846896, below=0.3260041) == "0.3260040993"  # a closer score: more digits
    assert float(exact(0.32600409920846896)) == 0.32600409920846896  # no score known: the float itself
    rng = np.random.default_rng(3)
    for _ in range(200):
        scores = rng.random(int(rng.integers(50, 400))) ** rng.uniform(0.3, 3)
        errors = (rng.random(scores.size) < 0.05 + 0.5 * scores).astype(int)
        result = cic.calibrate(scores, errors, alpha=0.25)
        if result.threshold is not None:
            printed = float(result.summary().split("score <= ")[1].split(":")[0])
            assert ((scores <= printed) == (scores <= result.threshold)).all()


@pytest.mark.parametrize(("score", "threshold"), [(0.32600412, 0.3260041), (0.3260041, 0.3260041),
                                                   (0.3260040999, 0.3260041), (0.1, 0.9), (0.9, 0.1),
                                                   (1.0000000000000002, 1.0), (0.0, 0.0)])
def test_a_score_printed_beside_its_threshold_stays_on_its_side(score: float, threshold: float) -> None:
    """`cic ask` prints score and threshold: comparing the printed numbers gives the gate's decision, with 4
    digits where they suffice."""
    from cic.stats.calibration import beside

    shown_score, shown_threshold = beside(score, threshold)
    assert (float(shown_score) <= float(shown_threshold)) == (score <= threshold)
    assert len(shown_score) <= 6 or abs(score - threshold) < 1e-4
