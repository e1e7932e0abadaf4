"""evaluate_splits / split_outcomes: agreement with per-split calibrate() calls, fails, and input checks."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats import protocol
from tests.support.tables import make_table

SEARCHES = [("paper", {}), ("bonferroni", {"grid": np.linspace(0.05, 1.0, 20)}),
            ("fixed_sequence", {"n_min": 30}), ("fixed_sequence", {"start": 0.105}), ("fixed_sequence", {})]


def _loop_reference(scores, errors, masks, *, alpha, bound, search, kwargs):
    """The protocol written the slow way: calibrate() on each split, then measure on its test part."""
    rows = []
    for cal in masks:
        res = cic.calibrate(scores[cal], errors[cal], alpha=alpha, bound=bound, search=search, **kwargs)
        test_s, test_e = scores[~cal], errors[~cal]
        if res.threshold is None:
            rows.append((None, None, 0.0))
            continue
        acc = test_s <= res.threshold
        fdr = test_e[acc].mean() if acc.any() else 0.0
        rows.append((res.threshold, fdr, acc.mean()))
    return rows


@pytest.mark.parametrize("search,kwargs", SEARCHES)
@pytest.mark.parametrize("bound", ["hoeffding", "cp"])
def test_split_outcomes_equal_a_loop_over_calibrate(search: str, kwargs: dict, bound: str) -> None:
    rng = np.random.default_rng(21)
    scores, errors = make_table(rng, 1500, decimals=2, slope=0.5, base=0.0)
    masks = cic.split_masks(1500, 12, 0.5, seed=3)
    frame = cic.split_outcomes(scores, errors, alphas=[0.1, 0.2], bounds=bound, search=search, n_splits=12,
                               seed=3, **kwargs)
    for alpha in (0.1, 0.2):
        sub = frame.filter(alpha=alpha).sort("split")
        expected = _loop_reference(scores, errors, masks, alpha=alpha, bound=bound, search=search, kwargs=kwargs)
        for (thr, fdr, cov), got in zip(expected, sub.iter_rows(named=True), strict=True):
            assert got["threshold"] == thr
            assert got["found"] == (thr is not None)
            assert (got["fdr"] is None) if fdr is None else got["fdr"] == pytest.approx(fdr)
            assert got["coverage"] == pytest.approx(cov)


def test_summary_table_columns_and_aggregates() -> None:
    rng = np.random.default_rng(22)
    scores, errors = make_table(rng, 2000)
    table = cic.evaluate_splits(scores, errors, n_splits=30)
    assert table.height == 10
    for col in ("fdr_mean", "fdr_std", "coverage_mean", "coverage_std", "correct_coverage_mean", "fails",
                "n_splits", "base_error_rate", "threshold_mean"):
        assert col in table.columns
    assert table["n_splits"].to_list() == [30] * 10
    assert table["base_error_rate"][0] == pytest.approx(errors.mean())
    outcomes = cic.split_outcomes(scores, errors, n_splits=30)
    for row in table.iter_rows(named=True):
        sub = outcomes.filter(alpha=row["alpha"], bound=row["bound"])
        found = sub.filter("found")
        assert row["fails"] == 30 - found.height
        if found.height:
            assert row["fdr_mean"] == pytest.approx(found["fdr"].mean())
            assert row["fdr_std"] == pytest.approx(found["fdr"].std(ddof=0))
            assert row["threshold_mean"] == pytest.approx(found["threshold"].mean())
        assert row["coverage_mean"] == pytest.approx(sub["coverage"].mean())


def test_each_row_carries_the_whole_tables_limits_at_its_alpha() -> None:
    from cic.stats.limits import ceiling, score_limit

    scores, errors = make_table(np.random.default_rng(22), 2000)
    table = cic.evaluate_splits(scores, errors, n_splits=5, alphas=[0.05, 0.2])
    for row in table.iter_rows(named=True):
        assert row["score_limit"] == score_limit(scores, errors, row["alpha"])
        assert row["ceiling"] == ceiling(errors.mean(), row["alpha"])
    assert table["score_limit"].n_unique() == 2


def test_correct_coverage_counts_accepted_correct_over_all_correct() -> None:
    scores = np.arange(400) / 400
    errors = (scores > 0.7).astype(int)
    out = cic.split_outcomes(scores, errors, alphas=[0.2], bounds="cp", n_splits=5)
    masks = cic.split_masks(400, 5, 0.5, seed=0)
    for row, cal in zip(out.iter_rows(named=True), masks, strict=True):
        test_s, test_e = scores[~cal], errors[~cal]
        acc = test_s <= row["threshold"]
        assert row["correct_coverage"] == pytest.approx((acc & (test_e == 0)).sum() / (test_e == 0).sum())


def test_unattainable_alpha_counts_every_split_as_a_fail() -> None:
    scores = np.linspace(0, 1, 300)
    errors = np.ones(300, dtype=int)
    table = cic.evaluate_splits(scores, errors, alphas=[0.1], bounds=["cp"], n_splits=7)
    row = table.row(0, named=True)
    assert row["fails"] == 7 and row["fdr_mean"] is None and row["threshold_mean"] is None
    assert row["coverage_mean"] == 0.0


def test_splits_processed_in_blocks_give_identical_results(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(23)
    scores, errors = make_table(rng, 800)
    whole = cic.evaluate_splits(scores, errors, n_splits=25, search=["paper", "fixed_sequence"])
    monkeypatch.setattr(protocol, "_BLOCK_CELLS", 800 * 3)
    assert cic.evaluate_splits(scores, errors, n_splits=25, search=["paper", "fixed_sequence"]).equals(whole)


def test_split_masks_are_exact_and_reproducible() -> None:
    masks = cic.split_masks(101, 50, 0.3, seed=9)
    assert masks.shape == (50, 101) and (masks.sum(axis=1) == 30).all()
    np.testing.assert_array_equal(masks, cic.split_masks(101, 50, 0.3, seed=9))
    assert not np.array_equal(masks, cic.split_masks(101, 50, 0.3, seed=10))
    assert len({row.tobytes() for row in masks}) == 50


@pytest.mark.parametrize("kwargs,message", [
    (dict(n_splits=0), "n_splits = 0"),
    (dict(cal_fraction=0.0), "cal_fraction = 0.0"),
    (dict(cal_fraction=1.0), "cal_fraction = 1.0"),
    (dict(cal_fraction=0.01), "calibration set of size 0"),
    (dict(cal_fraction=0.99), "test set of size 0"),
    (dict(alphas=[0.1, 1.2]), r"alphas\[1\] = 1.2"),
    (dict(alphas=[]), "alphas is empty"),
    (dict(bounds=["cp", "agresti"]), "bound = 'agresti'"),
    (dict(search="bonferroni"), "needs grid"),
    (dict(delta=0.0), "delta = 0.0"),
])
def test_bad_input_names_the_argument(kwargs: dict, message: str) -> None:
    scores, errors = np.linspace(0, 1, 20), np.zeros(20, dtype=int)
    with pytest.raises(UserError, match=message):
        cic.evaluate_splits(scores, errors, **kwargs)


@pytest.mark.parametrize(("n_items", "fraction", "expected"), [(5, 0.5, 3), (7, 0.5, 4), (9, 0.5, 5), (10, 0.3, 3),
                                                               (3, 0.5, 2), (1000, 0.25, 250), (11, 0.05, 1)])
def test_calibration_size_rounds_halves_up_whatever_their_parity(n_items: int, fraction: float,
                                                                 expected: int) -> None:
    from cic.stats.protocol import calibration_size

    assert calibration_size(n_items, fraction) == expected
    assert int(cic.split_masks(n_items, 3, fraction, seed=1).sum(axis=1)[0]) == expected


def test_split_masks_rows_come_one_at_a_time_with_the_same_seed() -> None:
    from cic.stats.protocol import iter_split_masks

    masks = cic.split_masks(501, 6, 0.4, seed=7)
    assert np.array_equal(np.stack(list(iter_split_masks(501, 6, 0.4, seed=7))), masks)
    assert (masks.sum(axis=1) == 200).all()


def test_progress_is_heard_before_the_work_and_after_every_search() -> None:
    """(0, steps) before the sort, then one report per (split, search, bound, alpha), ending at (steps, steps)."""
    rng = np.random.default_rng(3)
    scores, errors = make_table(rng, 500)
    heard: list[tuple[int, int]] = []
    cic.evaluate_splits(scores, errors, alphas=[0.1, 0.2], bounds=["cp", "hoeffding"], search=["fallback", "paper"],
                        n_splits=3, progress=lambda done, total: heard.append((done, total)))
    steps = 3 * 2 * 2 * 2
    assert heard[0] == (0, steps) and heard[-1] == (steps, steps)
    assert [done for done, _ in heard] == list(range(steps + 1))
