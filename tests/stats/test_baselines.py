"""Baselines: hand-computed answers on one calibration set, and the vectorised split version against a loop."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats import baselines as B
from tests.support.tables import make_table

SCORES = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
ERRORS = np.array([0, 1, 0, 0, 1])


def test_naive_is_the_largest_threshold_with_empirical_error_at_most_alpha() -> None:
    # FD/n at 0.1..0.5: 0, 1/2, 1/3, 1/4, 2/5
    assert B.naive_threshold(SCORES, ERRORS, 0.25) == 0.4
    assert B.naive_threshold(SCORES, ERRORS, 0.2) == 0.1
    assert B.naive_threshold(SCORES[1:], ERRORS[1:], 0.2) is None  # 1/1, 1/2, 1/3, 2/4: none <= 0.2


def test_naive_accepts_exact_equality_despite_floating_point() -> None:
    # 29 errors in 100: 0.29 * 100 is 28.999999999999996 in floating point, still feasible
    scores, errors = np.arange(100.0), np.r_[np.ones(29), np.zeros(71)]
    assert B.naive_threshold(scores, errors, 0.29) == 99.0


def test_lec_rule_needs_a_margin_of_one() -> None:
    # sum (E_i - alpha) at 0.1..0.5 with alpha = 0.5: -0.5, 0, -0.5, -1, -0.5  -> only t = 0.4 reaches -1
    assert B.lec_threshold(SCORES, ERRORS, 0.5) == 0.4
    # alpha = 0.25: -0.25, 0.5, 0.25, 0, 0.75: never <= -1
    assert B.lec_threshold(SCORES, ERRORS, 0.25) is None


def _block_table() -> tuple[np.ndarray, np.ndarray]:
    """Seven tied blocks of 100 items; the 4th block is all wrong, the others all right.

    Hoeffding at delta = 0.05, alpha = 0.2, cumulative (FD, n) per block and FD/n + sqrt(log 20 / 2n):
    (0,100) .122 ok, (0,200) .087 ok, (0,300) .071 ok, (100,400) .311 no, (100,500) .255 no,
    (100,600) .217 no, (100,700) .189 ok.
    """
    scores = np.repeat(np.arange(1.0, 8.0), 100)
    errors = np.repeat([0, 0, 0, 1, 0, 0, 0], 100)
    return scores, errors


def test_coin_binary_search_stops_at_the_first_boundary_it_finds() -> None:
    scores, errors = _block_table()
    # probes: mid 3 (block 4) fails -> below; mid 1 passes; mid 2 passes -> block 3, threshold 3.0
    assert B.coin_binary_threshold(scores, errors, 0.2, delta=0.05, bound="hoeffding") == 3.0
    # the paper search takes the largest feasible candidate, block 7
    assert cic.calibrate(scores, errors, alpha=0.2, bound="hoeffding", search="paper").threshold == 7.0
    assert B.naive_threshold(scores, errors, 0.2) == 7.0  # 100/500 = 0.2 passes too: 7 is the largest
    assert B.lec_threshold(scores, errors, 0.2) == 7.0  # 101 <= 140


def test_coin_binary_search_none_when_no_probe_passes() -> None:
    scores, errors = _block_table()
    assert B.coin_binary_threshold(scores, errors, 0.05, bound="hoeffding") is None


def test_conformal_alignment_by_hand() -> None:
    cal_s, cal_e = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 0, 1])
    test = np.array([4.5, 0.5, 2.5, 1.5, 3.5])
    # p = (1 + #{cal errors with score <= u}) / 5: 0.6, 0.2, 0.4, 0.2, 0.4; BH at 0.5 with m = 5:
    # sorted p .2 .2 .4 .4 .6 vs k*0.1: k = 2 (.2 <= .2) and k = 4 (.4 <= .4) pass, k = 5 fails -> 4 accepted
    assert B.conformal_alignment_select(cal_s, cal_e, test, 0.5).tolist() == [False, True, True, True, True]
    # at 0.3: thresholds .06 .12 .18 .24 .3; no sorted p passes -> nothing accepted
    assert not B.conformal_alignment_select(cal_s, cal_e, test, 0.3).any()


def test_conformal_alignment_ties_with_calibration_errors_count_them() -> None:
    # a test item tied with a calibration error counts it (U_i <= U_j)
    p_mask = B.conformal_alignment_select(np.array([1.0, 2.0]), np.array([1, 0]), np.array([1.0]), 0.7)
    # p = (1 + 1) / 3 = 0.667 <= 0.7 * 1 / 1 -> accepted; at alpha 0.6 it is not
    assert p_mask.tolist() == [True]
    assert B.conformal_alignment_select(np.array([1.0, 2.0]), np.array([1, 0]), np.array([1.0]), 0.6).tolist() == [
        False]


@pytest.mark.parametrize("bound", ["cp", "hoeffding"])
def test_split_outcomes_equal_a_loop_over_the_single_set_rules(bound: str) -> None:
    scores, errors = make_table(np.random.default_rng(5), 900, decimals=2, base=0.02)
    masks = cic.split_masks(900, 12, 0.4, seed=9)
    out = B.baseline_outcomes(scores, errors, alphas=[0.1, 0.2], n_splits=12, cal_fraction=0.4, seed=9, bound=bound)
    single = {"naive": B.naive_threshold, "lec": B.lec_threshold,
              "coin_binary": lambda s, e, a: B.coin_binary_threshold(s, e, a, bound=bound)}
    for alpha in (0.1, 0.2):
        for method in B.METHODS:
            rows = out.filter(alpha=alpha, method=method).sort("split").iter_rows(named=True)
            for row, cal in zip(rows, masks, strict=True):
                test_s, test_e = scores[~cal], errors[~cal]
                if method == "conformal_alignment":
                    accepted = B.conformal_alignment_select(scores[cal], errors[cal], test_s, alpha)
                    assert row["found"] == bool(accepted.any())
                else:
                    threshold = single[method](scores[cal], errors[cal], alpha)
                    assert row["threshold"] == threshold
                    accepted = test_s <= threshold if threshold is not None else np.zeros(test_s.shape, bool)
                assert row["test_accepted"] == accepted.sum()
                assert row["test_errors"] == test_e[accepted].sum()
                assert row["coverage"] == pytest.approx(accepted.mean())
                if row["found"] and accepted.any():
                    assert row["fdr"] == pytest.approx(test_e[accepted].mean())


def test_compare_methods_puts_cic_on_the_same_splits() -> None:
    scores, errors = make_table(np.random.default_rng(6), 1000, decimals=3, base=0.02)
    table = B.compare_methods(scores, errors, alphas=[0.15], n_splits=20, seed=4, cal_fraction=0.5)
    assert table["method"].to_list() == ["cic_paper", "cic_fallback", "cic_geometric", "cic_fixed_sequence",
                                         "cic_multistart", "naive", "coin_binary", "conformal_alignment", "lec"]
    # each CIC search carries the guarantee its registry entry states: Algorithm 1 as printed has none
    assert dict(zip(table["method"], table["guarantee"], strict=True)) == {
        "cic_paper": "none", "cic_fallback": "high-probability", "cic_geometric": "high-probability",
        "cic_fixed_sequence": "high-probability",
        "cic_multistart": "high-probability",
        "naive": "none",
        "coin_binary": "high-probability", "conformal_alignment": "expectation", "lec": "expectation"}
    reference = cic.evaluate_splits(scores, errors, alphas=[0.15], bounds="cp", n_splits=20, seed=4, search="paper")
    row = table.filter(method="cic_paper").row(0, named=True)
    assert row["coverage_mean"] == reference["coverage_mean"][0]
    assert row["fdr_mean"] == reference["fdr_mean"][0]
    # the plug-in rule accepts at least as much as the certified one on every split, so more on average
    naive = table.filter(method="naive").row(0, named=True)
    assert naive["coverage_mean"] >= row["coverage_mean"]
    assert naive["fdr_above_alpha"] > row["fdr_above_alpha"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(methods=["magic"]), "method = 'magic'"),
    (dict(methods=[]), "methods is empty"),
    (dict(alphas=[1.5]), "alphas[0] = 1.5"),
    (dict(bound="nope"), "bound = 'nope'"),
    (dict(n_splits=0), "n_splits = 0"),
])
def test_bad_arguments_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        B.baseline_outcomes(SCORES, ERRORS, **kwargs)


def test_fdp_mean_counts_empty_selections_as_zero() -> None:
    scores, errors = make_table(np.random.default_rng(7), 600, decimals=3, base=0.05)
    table = B.compare_methods(scores, errors, alphas=[0.08], n_splits=15, seed=2)
    outcomes = B.baseline_outcomes(scores, errors, alphas=[0.08], n_splits=15, seed=2)
    for method in B.METHODS:
        per_split = outcomes.filter(method=method)["fdr"].fill_null(0.0).to_numpy()
        assert table.filter(method=method)["fdp_mean"][0] == pytest.approx(per_split.mean())
    outcomes = cic.split_outcomes(scores, errors, alphas=[0.08], bounds="cp", n_splits=15, seed=2)
    assert table.filter(method="cic_paper")["fdp_mean"][0] == pytest.approx(
        outcomes["fdr"].fill_null(0.0).mean())


def test_compare_methods_reuses_cic_rows_only_from_the_same_protocol() -> None:
    import polars as pl

    scores, errors = make_table(np.random.default_rng(8), 800, decimals=3, base=0.02)
    fresh = B.compare_methods(scores, errors, alphas=[0.15], methods=["naive"], cic_searches=["paper"],
                              n_splits=10, seed=1)
    for changed in ({"seed": 99}, {"delta": 0.2}, {"n_splits": 7}, {"cal_fraction": 0.3}):
        protocol = {"delta": 0.05, "n_splits": 10, "seed": 1, "cal_fraction": 0.5, **changed}
        other = cic.evaluate_splits(scores, errors, alphas=[0.15], bounds="cp", search="paper",
                                    **protocol).with_columns(
            seed=pl.lit(protocol["seed"]), cal_fraction=pl.lit(protocol["cal_fraction"]), coverage_mean=pl.lit(-1.0))
        table = B.compare_methods(scores, errors, alphas=[0.15], methods=["naive"], cic_searches=["paper"],
                                  n_splits=10, seed=1, known=other)
        assert table.filter(method="cic_paper")["coverage_mean"][0] == fresh.filter(
            method="cic_paper")["coverage_mean"][0] != -1.0, changed
    same = cic.evaluate_splits(scores, errors, alphas=[0.15], bounds="cp", search="paper", n_splits=10,
                               seed=1).with_columns(seed=pl.lit(1), cal_fraction=pl.lit(0.5),
                                                    coverage_mean=pl.lit(-1.0))  # marked: reused rows show it
    reused = B.compare_methods(scores, errors, alphas=[0.15], methods=["naive"], cic_searches=["paper"],
                               n_splits=10, seed=1, known=same)
    assert reused.filter(method="cic_paper")["coverage_mean"][0] == -1.0
