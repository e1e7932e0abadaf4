"""Upper confidence bounds: hand values, scipy references, the feasibility forms and the max-FD tables."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from cic.errors import UserError
from cic.stats import bounds

ALL = bounds.BOUND_NAMES


def test_hoeffding_hand_value() -> None:
    assert bounds.hoeffding_ucb(2, 10, 0.05) == pytest.approx(0.2 + math.sqrt(math.log(20) / 20), abs=1e-15)
    assert bounds.hoeffding_ucb(0, 100, 0.1) == pytest.approx(math.sqrt(math.log(10) / 200))


def test_clopper_pearson_matches_scipy_beta_ppf() -> None:
    for n in (1, 2, 5, 17, 100, 1000, 25_000):
        fd = np.unique(np.linspace(0, n - 1, 13).astype(int))
        for gamma in (0.001, 0.05, 0.3):
            expected = stats.beta.ppf(1 - gamma, fd + 1, n - fd)
            np.testing.assert_allclose(bounds.clopper_pearson_ucb(fd, n, gamma), expected, rtol=1e-10)


def test_clopper_pearson_hand_value_zero_errors() -> None:
    # With FD = 0 the bound solves (1 - B)^n = gamma.
    assert bounds.clopper_pearson_ucb(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10), rel=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_every_bound_is_one_when_nothing_is_accepted(name: str) -> None:
    assert bounds.ucb(name, 0, 0, 0.05) == 1.0
    assert not bounds.feasible(name, 0, 0, 0.5, 0.05)


def test_clopper_pearson_is_one_when_every_accepted_answer_is_wrong() -> None:
    np.testing.assert_array_equal(bounds.clopper_pearson_ucb([1, 7, 300], [1, 7, 300], 0.05), 1.0)


def test_vectorised_shapes_and_scalars() -> None:
    out = bounds.clopper_pearson_ucb(np.array([[0, 1], [2, 3]]), 10, 0.05)
    assert out.shape == (2, 2)
    assert isinstance(bounds.hoeffding_ucb(1, 5, 0.05), float)
    assert isinstance(bounds.clopper_pearson_feasible(1, 50, 0.2, 0.05), bool)


def _grid() -> tuple[np.ndarray, np.ndarray]:
    n = np.repeat(np.arange(0, 160), 160)
    fd = np.tile(np.arange(0, 160), 160)
    keep = fd <= n
    return fd[keep], n[keep]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("alpha,gamma", [(0.05, 0.05), (0.2, 0.01), (0.3, 0.6)])
def test_feasibility_form_agrees_with_the_bound(name: str, alpha: float, gamma: float) -> None:
    fd, n = _grid()
    u = np.asarray(bounds.ucb(name, fd, n, gamma))
    ok = np.asarray(bounds.feasible(name, fd, n, alpha, gamma))
    clear = np.abs(u - alpha) > 1e-9  # away from exact equality, where rounding may differ
    np.testing.assert_array_equal(ok[clear], (u <= alpha)[clear])
    assert clear.mean() > 0.99


def test_clopper_pearson_feasibility_is_the_binomial_cdf_test() -> None:
    fd, n = _grid()
    pos = n > 0
    expected = stats.binom.cdf(fd[pos], n[pos], 0.1) <= 0.05
    np.testing.assert_array_equal(bounds.clopper_pearson_feasible(fd[pos], n[pos], 0.1, 0.05), expected)


def test_kl_bound_solves_its_defining_equation_and_orders_between_cp_and_hoeffding() -> None:
    fd, n = _grid()
    pos = (n > 0) & (fd < n)
    fd, n = fd[pos], n[pos]
    kl_ucb = bounds.hoeffding_kl_ucb(fd, n, 0.05)
    p = fd / n
    kl = p * np.log(np.where(p > 0, p / kl_ucb, 1)) + (1 - p) * np.log((1 - p) / (1 - kl_ucb))
    np.testing.assert_allclose(n * kl, math.log(20), rtol=1e-6)
    assert (bounds.clopper_pearson_ucb(fd, n, 0.05) <= kl_ucb + 1e-12).all()
    assert (kl_ucb <= bounds.hoeffding_ucb(fd, n, 0.05) + 1e-12).all()


def test_bentkus_is_clopper_pearson_at_gamma_over_e_and_hb_is_the_minimum() -> None:
    fd, n = _grid()
    np.testing.assert_allclose(bounds.bentkus_ucb(fd, n, 0.05), bounds.clopper_pearson_ucb(fd, n, 0.05 / math.e))
    hb = bounds.hoeffding_bentkus_ucb(fd, n, 0.05)
    np.testing.assert_allclose(hb, np.minimum(bounds.hoeffding_kl_ucb(fd, n, 0.05), bounds.bentkus_ucb(fd, n, 0.05)))
    assert (bounds.clopper_pearson_ucb(fd, n, 0.05) <= hb + 1e-12).all()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("alpha,gamma", [(0.05, 0.05), (0.1, 0.0005), (0.25, 0.05), (0.4, 0.7)])
def test_max_errors_table_matches_brute_force(name: str, alpha: float, gamma: float) -> None:
    n = np.arange(0, 400)
    table = bounds.max_errors(name, n, alpha, gamma)
    for count in range(0, 400, 7):
        fds = np.arange(0, count + 1)
        ok = np.flatnonzero(np.asarray(bounds.feasible(name, fds, np.full_like(fds, count), alpha, gamma)))
        assert table[count] == (ok.max() if ok.size else -1), (name, count)


def test_max_errors_for_large_counts_and_arbitrary_order() -> None:
    n = np.array([250_000, 3, 100_000, 100_001, 99_999, 0])
    for name in ("cp", "hoeffding", "bentkus"):
        table = bounds.max_errors(name, n, 0.1, 0.05)
        for count, k in zip(n, table, strict=True):
            if count == 0:
                assert k == -1
                continue
            assert k == -1 or bounds.feasible(name, int(k), int(count), 0.1, 0.05)
            assert k + 1 >= count or not bounds.feasible(name, int(k) + 1, int(count), 0.1, 0.05)


def test_min_certifiable_n_closed_forms() -> None:
    assert bounds.min_certifiable_n("cp", 0.1, 0.05) == math.ceil(math.log(0.05) / math.log(0.9))
    assert bounds.min_certifiable_n("hoeffding", 0.1, 0.05) == math.ceil(math.log(20) / (2 * 0.01))


def test_half_alpha_n_is_the_first_count_certifying_half_alpha() -> None:
    n0 = bounds.half_alpha_n("cp", 0.1, 0.05)
    assert bounds.feasible("cp", int(0.05 * n0), n0, 0.1, 0.05)
    assert not any(bounds.feasible("cp", int(0.05 * m), m, 0.1, 0.05) for m in range(1, n0))


@pytest.mark.parametrize("call,message", [
    (lambda: bounds.clopper_pearson_ucb(5, 3, 0.05), "fd = 5.0 with n = 3.0"),
    (lambda: bounds.hoeffding_ucb(1, -2, 0.05), "n = -2.0"),
    (lambda: bounds.hoeffding_ucb(1.5, 4, 0.05), "fd = 1.5"),
    (lambda: bounds.hoeffding_ucb(1, 4, 0.0), "gamma = 0.0"),
    (lambda: bounds.clopper_pearson_feasible(1, 4, 1.0, 0.05), "alpha = 1.0"),
    (lambda: bounds.ucb("wilson", 1, 4, 0.05), "bound = 'wilson'"),
])
def test_bad_input_names_the_argument(call, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        call()


def test_aliases_resolve() -> None:
    assert bounds.resolve_bound("Clopper_Pearson") == "cp"
    assert bounds.resolve_bound("hfd") == "hoeffding"
    assert bounds.resolve_bound("hb") == "hoeffding_bentkus"


def _cp_by_bisection(fd: int, n: int, gamma: float) -> float:
    """Independent reference: the q with BinomCDF(fd; n, q) = gamma, by bisection on the exact binomial CDF."""
    from scipy import stats

    lo, hi = fd / n, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if stats.binom.cdf(fd, n, mid) > gamma:
            lo = mid
        else:
            hi = mid
    return hi


@pytest.mark.parametrize(("fd", "n", "gamma"), [(0, 1000, 1e-300), (0, 10**6, 1e-300), (3, 10**6, 0.05 / 10**6),
                                                (10, 5000, 1e-20), (0, 500, 1e-17)])
def test_clopper_pearson_keeps_its_precision_for_tiny_gamma(fd: int, n: int, gamma: float) -> None:
    got = bounds.clopper_pearson_ucb(fd, n, gamma)
    assert got < 1.0
    assert got == pytest.approx(_cp_by_bisection(fd, n, gamma), rel=1e-9)
    if fd == 0:  # closed form: 1 - gamma^(1/n)
        assert got == pytest.approx(-np.expm1(np.log(gamma) / n), rel=1e-12)


def test_every_registered_bound_is_one_record_used_everywhere() -> None:
    import cic
    from cic.reports.tables import bound_label

    scores = np.linspace(0, 1, 400)
    errors = (np.arange(400) % 25 == 0).astype(int)
    for name, record in bounds.BOUNDS.items():
        assert bounds.get_bound(name) is record and record.label and record.description
        for alias in record.aliases:
            assert bounds.resolve_bound(alias) == name
        res = cic.calibrate(scores, errors, alpha=0.2, bound=name)
        assert res.feasible and res.bound_value <= 0.2
        table = bounds.max_errors(name, np.arange(1, 400), 0.2, 0.05)
        direct = [max([k for k in range(n + 1) if bounds.feasible(name, k, n, 0.2, 0.05)], default=-1)
                  for n in range(1, 400, 37)]
        assert table[::37].tolist() == direct
        assert bound_label(name).startswith("UCB-")
    assert bound_label("cp") == "UCB-CP" and bound_label("hoeffding") == "UCB-HFD"


def _miss_probability(ucb: Any, n: int, gamma: float, p: float) -> float:
    """P_p(UCB(K, n; γ) < p), K ~ Binomial(n, p), summed exactly over K."""
    k = np.arange(n + 1)
    return float(stats.binom.pmf(k, n, p)[np.asarray(ucb(k, n, gamma)) < p].sum())


@pytest.mark.parametrize("name", ALL)
def test_every_bound_covers_the_true_rate_with_probability_at_least_one_minus_gamma(name: str) -> None:
    """The guarantee itself, computed exactly rather than checked for consistency: for every true error rate p on
    a fine grid, the chance that the bound falls below p is at most γ (n from 10 to 400). A bound that is too small
    — Clopper–Pearson at 2γ, below — fails it."""
    record = bounds.get_bound(name)
    grid = np.linspace(0.005, 0.995, 199)
    for n in (10, 57, 400):
        for gamma in (0.05, 0.2):
            worst = max(_miss_probability(record.ucb, n, gamma, p) for p in grid)
            assert worst <= gamma + 1e-9, (name, n, gamma, worst)


def test_the_coverage_check_fails_a_bound_that_is_too_small() -> None:
    too_small = lambda k, n, gamma: bounds.clopper_pearson_ucb(k, n, 2 * gamma)  # noqa: E731
    grid = np.linspace(0.005, 0.995, 199)
    assert max(_miss_probability(too_small, 57, 0.05, p) for p in grid) > 0.05


@pytest.mark.parametrize("bound", ["cp", "hoeffding"])
def test_the_margin_entry_is_half_alpha_up_to_one_half_and_grows_with_alpha_above(bound: str) -> None:
    """`margin_n` is `half_alpha_n` for every alpha <= 1/2 (the default search's entries, and every table measured
    before issue 73, are unchanged there); above, the margin alpha - rate shrinks with 1 - alpha, so the count grows."""
    from cic.stats.bounds import half_alpha_n, margin_n, margin_rate

    for alpha in (0.01, 0.05, 0.1, 0.2, 0.3, 0.45, 0.5):
        for gamma in (0.05, 0.03, 0.003, 1e-4):
            assert margin_n(bound, alpha, gamma) == half_alpha_n(bound, alpha, gamma), (alpha, gamma)
    assert margin_rate(0.5) == 0.25 and margin_rate(0.9) == pytest.approx(0.85)
    above = [margin_n(bound, alpha, 0.03) for alpha in (0.6, 0.75, 0.88, 0.95)]
    assert above == sorted(above) and above[0] > half_alpha_n(bound, 0.6, 0.03)
