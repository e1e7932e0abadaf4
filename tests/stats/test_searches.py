"""The search registry: every search's rule against a literal reference, its guarantee text, and validity."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.searches import DEFAULT_SEARCH, SEARCH_NAMES, SEARCHES, get_search
from tests.support import reference
from tests.support.tables import make_table


def test_every_search_states_its_guarantee_once_and_paper_claims_none() -> None:
    for search in SEARCHES.values():
        assert search.guarantee and search.claim and search.short_guarantee and search.label
    assert SEARCHES["paper"].guarantee_kind == "none"
    assert SEARCHES["paper"].short_guarantee == "none simultaneous"
    assert SEARCHES["lec"].guarantee_kind == "expectation" and "expectation" in SEARCHES["lec"].guarantee
    assert {s.guarantee_kind for name, s in SEARCHES.items() if name not in ("paper", "lec")} == {"high-probability"}
    assert DEFAULT_SEARCH == "fallback"
    assert cic.calibrate(np.linspace(0, 1, 300), np.zeros(300), alpha=0.1).search == "fallback"


def test_unknown_search_is_refused_with_the_choices() -> None:
    with pytest.raises(UserError, match="search = 'greedy': unknown; choose one of fallback, geometric, "
                                        "fixed_sequence"):
        get_search("greedy")
    assert get_search("multistart[8]").n_starts == 8
    assert "8 fixed-sequence chains" in get_search("multistart[8]").guarantee


@pytest.mark.parametrize("bound", ["cp", "hoeffding"])
def test_holm_equals_the_literal_step_down_and_is_at_least_bonferroni(rng: np.random.Generator, bound: str) -> None:
    grid = cic.uniform_grid(0.05, 1.0, 15)
    for trial in range(30):
        scores, errors = make_table(rng, int(rng.integers(60, 500)), decimals=2, slope=0.4, base=0.02)
        alpha = float(rng.choice([0.1, 0.15, 0.2]))
        got = cic.calibrate(scores, errors, alpha=alpha, bound=bound, search="holm", grid=grid)
        assert got.threshold == reference.holm(scores, errors, grid, alpha, 0.05, bound), trial
        bonf = cic.calibrate(scores, errors, alpha=alpha, bound=bound, search="bonferroni", grid=grid).threshold
        if bonf is not None:
            assert got.threshold is not None and got.threshold >= bonf
        if got.threshold is not None:  # the reported level is the step at which it was certified
            assert got.bound_value <= alpha and 0.05 / 15 <= got.gamma <= 0.05


@pytest.mark.parametrize("n_starts", [2, 4])
def test_multistart_equals_the_literal_chains(rng: np.random.Generator, n_starts: int) -> None:
    for trial in range(30):
        scores, errors = make_table(rng, int(rng.integers(80, 400)), decimals=2, slope=0.4, base=0.02)
        got = cic.calibrate(scores, errors, alpha=0.2, bound="cp", search=f"multistart[{n_starts}]", n_min=20)
        assert got.threshold == reference.multistart(scores, errors, 0.2, 0.05, "cp", n_starts, 20), trial


def test_multistart_gets_past_a_bump_that_stops_fixed_sequence() -> None:
    # risk is high among the first 100 scores, then none for the next 900: one chain stops at once
    scores = np.arange(1000) / 1000
    errors = np.zeros(1000, dtype=int)
    errors[40:100:2] = 1
    fixed = cic.calibrate(scores, errors, alpha=0.1, search="fixed_sequence", n_min=50)
    multi = cic.calibrate(scores, errors, alpha=0.1, search="multistart", n_min=50)
    assert fixed.threshold is None
    assert multi.threshold is not None and multi.threshold > 0.9


def test_geometric_chains_start_at_halves_with_harmonic_levels_and_equal_the_literal_chains(
        rng: np.random.Generator) -> None:
    from cic.stats.bounds import half_alpha_n
    from cic.stats.searches import BOTTOM_SHARE, geometric_chains

    chains = geometric_chains(10_000, "cp", 0.15, 0.05)
    bottom, rest = 0.05 * BOTTOM_SHARE, 0.05 * (1 - BOTTOM_SHARE)
    assert chains[0] == (half_alpha_n("cp", 0.15, bottom), pytest.approx(bottom))  # fixed_sequence's first test
    harmonic = sum(1 / k for k in range(1, len(chains)))
    assert [first for first, _ in chains[1:]] == [5000, 2500, 1250, 625, 313]
    assert [level for _, level in chains[1:]] == pytest.approx([rest / (k * harmonic) for k in range(1, 6)])
    assert sum(level for _, level in chains) == pytest.approx(0.05)
    assert 313 >= half_alpha_n("cp", 0.15, chains[-1][1]) and 157 < half_alpha_n("cp", 0.15, rest / (6 * (
        harmonic + 1 / 6)))  # a 6th geometric chain would start where its own level cannot certify alpha / 2
    assert geometric_chains(40, "cp", 0.15, 0.05) == ((half_alpha_n("cp", 0.15, 0.05), 0.05),)  # too few: one
    for trial in range(25):
        scores, errors = make_table(rng, int(rng.integers(200, 700)), decimals=2, slope=0.4, base=0.02)
        got = cic.calibrate(scores, errors, alpha=0.2, bound="cp", search="geometric")
        chains = list(geometric_chains(scores.shape[0], "cp", 0.2, 0.05))
        assert got.threshold == reference.geometric(scores, errors, 0.2, 0.05, "cp", chains), trial


@pytest.mark.parametrize("bound", ["cp", "hoeffding"])
def test_fallback_equals_the_literal_graphical_procedure_in_any_order(rng: np.random.Generator, bound: str) -> None:
    """calibrate's lazy scan and the split protocol's matrix path both equal the graphical procedure written out
    (levels handed on, rejections in a random order), on smooth, tied and clustered tables."""
    from cic.stats.searches import Setting

    for trial in range(20):
        n = int(rng.integers(150, 900))
        scores, errors = make_table(rng, n, decimals=int(rng.choice([1, 2, 3])), slope=0.4, base=0.02)
        if trial % 3 == 0:  # a confident-but-wrong cluster among the lowest scores
            errors[np.argsort(scores, kind="stable")[: n // 20]] = 1
        alpha = float(rng.choice([0.1, 0.15, 0.2, 0.45]))
        ordered = np.sort(scores)
        counts = np.searchsorted(ordered, np.unique(ordered), side="right")  # each candidate's accepted count
        entries = list(get_search("fallback").entries_on(Setting(n, bound, alpha), 0.05, counts))
        assert sum(share for _, share in entries) == pytest.approx(0.05)
        got = cic.calibrate(scores, errors, alpha=alpha, bound=bound, search="fallback")
        assert got.threshold == reference.fallback(scores, errors, alpha, 0.05, bound, entries, seed=trial), trial
        rows = cic.split_outcomes(scores, errors, alphas=[alpha], bounds=bound, search="fallback", n_splits=3,
                                  cal_fraction=0.5, seed=trial)
        for split, half in enumerate(cic.split_masks(n, 3, 0.5, seed=trial)):  # several sets at once, ties too
            assert rows["threshold"][split] == cic.calibrate(scores[half], errors[half], alpha=alpha, bound=bound,
                                                             search="fallback").threshold


def test_fallback_on_many_calibration_sets_at_once_equals_each_set_alone(rng: np.random.Generator) -> None:
    """The simulator's matrix path (many rows, per-row carried levels) against one row at a time."""
    from cic.stats.searches import Setting, candidate_matrix, run_search

    search = get_search("fallback")
    for alpha in (0.2, 0.3):
        u = np.sort(np.round(rng.random((12, 600)), 2), axis=1)
        p = 0.03 + 0.35 * u + 0.5 * (u < 0.04)  # a confident-but-wrong cluster in some rows' lowest scores
        e = (rng.random(u.shape) < p).astype(np.int64)
        values, n, fd, candidate = candidate_matrix(u, np.cumsum(e, axis=1))
        setting = Setting(600, "cp", alpha)
        together = run_search(search, values, n, fd, setting=setting, delta=0.05, candidate=candidate).index
        alone = [run_search(search, values[i], n[i], fd[i], setting=setting, delta=0.05,
                            candidate=candidate[i]).index[0] for i in range(12)]
        assert together.tolist() == alone and max(alone) >= 0


def test_the_default_answers_past_a_confident_but_wrong_cluster_that_traps_every_chain() -> None:
    """The blind spot the default was chosen against: the 3% most confident answers are wrong half the time, the
    error rate among accepted answers then falls under alpha = 0.05 (from about 32% to 46% of answers) and rises
    again. Every chain starts inside the cluster or outside the valid region (n/4, n/2); grid entries do not."""
    rng = np.random.default_rng(4)
    n = 100_000
    u = np.sort(rng.random(n))
    p = np.interp(u, [0, 0.03, 0.03 + 1e-9, 0.4, 0.48, 1], [0.5, 0.5, 0.002, 0.002, 0.3, 0.3])
    e = (rng.random(n) < p).astype(int)
    chains = cic.calibrate(u, e, alpha=0.05, search="geometric")
    default = cic.calibrate(u, e, alpha=0.05)
    assert chains.threshold is None
    assert default.threshold is not None and 0.38 < default.threshold < 0.47, default


def test_lec_is_the_baselines_rule_and_no_gate_of_it_serves() -> None:
    from cic.pipeline.gates.serving_state import guaranteed
    from cic.stats.baselines import lec_threshold

    rng = np.random.default_rng(8)
    for trial in range(40):
        scores, errors = make_table(rng, int(rng.integers(20, 400)), decimals=2, slope=0.4, base=0.02)
        alpha = float(rng.choice([0.05, 0.1, 0.2]))
        assert cic.calibrate(scores, errors, alpha=alpha, search="lec").threshold == lec_threshold(
            scores, errors, alpha), trial
    assert not guaranteed({"search": "lec"}) and guaranteed({"search": "fallback"})


def test_the_default_does_not_collapse_where_one_chain_does() -> None:
    """The collapse the default was chosen against: P(error | U = u) = 0.05 + 0.3u, alpha = 0.15 (largest valid
    threshold 2/3), 10,000 answers. One chain from the n_min-th score ends below 1/3 in about a third of draws;
    the geometric chains never do here, and certify about 0.60 on average."""
    model = cic.PowerRisk(0.05, 0.35)
    one = cic.simulate(model, n=10_000, alpha=0.15, search="fixed_sequence", n_trials=60, seed=5)
    default = cic.simulate(model, n=10_000, alpha=0.15, search=DEFAULT_SEARCH, n_trials=60, seed=5)
    assert one.fails >= 5 and one.mean_coverage < 0.5, one.summary()
    assert default.fails == 0 and default.mean_coverage > 0.57, default.summary()


@pytest.mark.parametrize("search", ["holm", "multistart", "geometric", "fallback"])
def test_new_searches_keep_the_violation_rate_below_delta(search: str) -> None:
    grid = cic.uniform_grid(0.05, 1.0, 20) if get_search(search).needs_grid else None
    res = cic.simulate(cic.PowerRisk(0.0, 0.4), n=400, alpha=0.1, delta=0.1, bound="cp", search=search,
                       n_trials=1500, grid=grid, seed=3)
    assert res.ci_low <= 0.1, res.summary()
    assert res.fails < res.n_trials  # and it does certify something


@pytest.mark.parametrize("search", SEARCH_NAMES)
def test_protocol_rows_equal_calibrate_on_the_same_split(search: str) -> None:
    rng = np.random.default_rng(11)
    scores, errors = make_table(rng, 600, decimals=3, base=0.02)
    kwargs = {"grid": cic.uniform_grid(0.05, 1.0, 12)} if get_search(search).needs_grid else {}
    rows = cic.split_outcomes(scores, errors, alphas=[0.15], bounds="cp", search=search, n_splits=4, seed=2,
                              **kwargs)
    masks = cic.split_masks(600, 4, 0.5, seed=2)
    for split in range(4):
        direct = cic.calibrate(scores[masks[split]], errors[masks[split]], alpha=0.15, bound="cp", search=search,
                               **kwargs)
        assert rows["threshold"][split] == direct.threshold


def test_every_function_that_searches_defaults_to_the_one_default_search() -> None:
    import inspect

    import cic
    from cic.stats import groups, protocol
    from cic.stats.searches import DEFAULT_SEARCH

    functions = [cic.calibrate, cic.evaluate_splits, protocol.split_outcomes, cic.simulate, *[
        f for _, f in inspect.getmembers(groups, inspect.isfunction)
        if f.__module__ == groups.__name__ and "search" in inspect.signature(f).parameters]]
    defaults = {f.__qualname__: inspect.signature(f).parameters["search"].default for f in functions}
    assert len(defaults) >= 6 and set(defaults.values()) == {DEFAULT_SEARCH}, defaults


def test_a_search_object_of_ones_own_is_run_like_a_named_one() -> None:
    """`calibrate` and `evaluate_splits` take a `Search` object as well as a name (as MAPIE takes a procedure):
    the registry's own object gives the named result, and a procedure of one's own decides by its `select`."""
    from dataclasses import dataclass

    from cic.stats.searches import LargestFeasible

    @dataclass(frozen=True)
    class HalfLevel(LargestFeasible):
        """Every candidate at delta / 2: a stricter rule of the caller's own."""

        def level(self, delta: float, k: int) -> float:
            return delta / 2

    rng = np.random.default_rng(5)
    scores = rng.random(600)
    errors = (rng.random(600) < 0.3 * scores).astype(int)
    named = cic.calibrate(scores, errors, alpha=0.2, search="geometric")
    assert cic.calibrate(scores, errors, alpha=0.2, search=get_search("geometric")) == named
    mine = HalfLevel("half_level", "every candidate at delta / 2", "FWER <= delta / 2", "high-probability",
                     takes_grid=False)  # every unique score, as the paper search: large inputs are binned
    got = cic.calibrate(scores, errors, alpha=0.2, delta=0.1, search=mine)
    as_paper = cic.calibrate(scores, errors, alpha=0.2, delta=0.05, search="paper")
    assert got.search == "half_level" and got.guarantee == "FWER <= delta / 2"
    assert (got.threshold, got.n_accepted, got.n_errors) == (as_paper.threshold, as_paper.n_accepted,
                                                             as_paper.n_errors)
    table = cic.evaluate_splits(scores, errors, alphas=(0.2,), search=mine, n_splits=5)
    assert table.get_column("search").to_list() == ["half_level", "half_level"]  # one row per bound
    big = rng.random(60_000)  # past the size where the paper-like searches bin the scores: its level still holds
    big_errors = (rng.random(60_000) < 0.3 * big).astype(int)
    binned = cic.calibrate(big, big_errors, alpha=0.1, delta=0.1, search=mine)
    strict = cic.calibrate(big, big_errors, alpha=0.1, delta=0.05, search="paper")
    assert binned.gamma == 0.05 and (binned.threshold, binned.bound_value) == (strict.threshold, strict.bound_value)
    assert binned.threshold != cic.calibrate(big, big_errors, alpha=0.1, delta=0.1, search="paper").threshold


@pytest.mark.parametrize("bound", ["cp", "hoeffding", "bentkus"])
def test_feasibility_tables_built_in_blocks_equal_one_table_over_the_span(bound: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans inside a block, across several blocks, at both ends, and past n_max: the same largest feasible FD as
    `max_errors` over those counts at once."""
    from cic.stats import bounds as bounds_module
    from cic.stats.searches import FeasibilityTables

    monkeypatch.setattr(FeasibilityTables, "BLOCK", 97)
    table = FeasibilityTables(bound, 0.1, 1000)
    for lo, hi in [(0, 1000), (5, 50), (90, 400), (97, 193), (999, 1000), (950, 5000), (300, 299)]:
        want = bounds_module.max_errors(bound, np.arange(lo, min(hi, 1000) + 1), 0.1, 0.01)
        assert np.array_equal(table(0.01, lo, hi), want), (lo, hi)


@pytest.mark.parametrize("search", ["fallback", "geometric", "fixed_sequence", "multistart", "paper", "lec"])
def test_a_one_set_scan_read_in_chunks_selects_what_one_read_selects(search: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The default search reads a calibration set in chunks and stops at the first failure; with chunks of 7
    candidates and tables in blocks of 13 counts it selects exactly what one read of everything selects."""
    import cic.stats.searches as searches_module
    import cic.stats.sequential as sequential_module
    from tests.support.tables import make_table

    sizes = np.random.default_rng(5).integers(200, 900, size=12)
    chosen = {}
    for chunk, block in ((10**9, 10**9), (7, 13)):
        monkeypatch.setattr(sequential_module, "SCAN_CHUNK", chunk)
        monkeypatch.setattr(searches_module.FeasibilityTables, "BLOCK", block)
        picks = []
        for trial in range(12):
            scores, errors = make_table(np.random.default_rng(trial), int(sizes[trial]))
            for alpha in (0.1, 0.2, 0.3):
                result = cic.calibrate(scores, errors, alpha=alpha, delta=0.05, bound="cp", search=search)
                picks.append((result.threshold, result.n_accepted, result.n_errors))
        chosen[chunk] = picks
    assert chosen[7] == chosen[10**9] and any(t is not None for t, _, _ in chosen[7])


def test_an_entry_that_ties_straddle_shares_its_level_with_the_tied_block_below_it() -> None:
    """No candidate at the entry's count (a tied block jumps over it): half its share goes to the block just below
    when that block can certify on it; with every count a candidate (continuous scores) nothing changes."""
    from cic.stats.bounds import min_certifiable_n
    from cic.stats.searches import tied_entries

    entries = ((150, 0.03), (200, 0.01), (250, 0.01))
    assert tied_entries(entries, np.arange(1, 301), "cp", 0.1) == entries
    blocks = np.array([75, 150, 225, 300])  # four tied blocks of 75
    got = dict(tied_entries(entries, blocks, "cp", 0.1))
    assert got == pytest.approx({150: 0.03 + 0.005, 200: 0.005, 225: 0.005, 250: 0.005})
    assert sum(got.values()) == pytest.approx(0.05)
    tiny = np.array([10, 300])  # a block below every entry too small to certify on half a share: untouched
    assert 10 < min_certifiable_n("cp", 0.1, 0.015) and tied_entries(entries, tiny, "cp", 0.1) == entries


def test_the_default_search_certifies_a_first_tied_block_that_its_entry_count_jumps_over() -> None:
    """Four tied score values of 75 answers each at n = 300: only the first block's error rate is below alpha. Its
    count (75) lies below the bottom entry's (the first count that can certify alpha / 2), so without the block as
    an entry the search starts at the second block, fails it and certifies nothing."""
    from cic.stats.searches import fallback_entries

    scores = np.repeat([0.1, 0.4, 0.7, 0.9], 75)
    errors = np.zeros(300, dtype=int)
    errors[75:][::4] = 1  # the later blocks: 25% wrong
    assert fallback_entries(300, "cp", 0.1, 0.05)[0][0] > 75
    got = cic.calibrate(scores, errors, alpha=0.1, bound="cp")
    assert got.threshold == 0.1 and got.n_accepted == 75


def _violations(search: object) -> float:
    """The share of 1,000 calibration sets (n = 2,000) on which `search` certifies a threshold when every threshold
    is invalid: the error rate is 0.105 everywhere, alpha = 0.1, delta = 0.05 — where a rule that tests many
    thresholds without a multiplicity correction certifies one far more often than delta."""
    from cic.stats.calibration import uniform_grid
    from cic.stats.simulation import PowerRisk, simulate

    grid = uniform_grid(0.0, 1.0, 20) if getattr(search, "needs_grid", False) else None
    return simulate(PowerRisk(0.105, 0.105, 1.0), n=2000, alpha=0.1, delta=0.05, search=search, n_trials=1000,
                    seed=3, grid=grid).violation_rate


#: delta plus 2.6 standard errors of a violation rate at delta over 1,000 sets (a valid search exceeds it with
#: probability < 0.5%)
FWER_LIMIT = 0.05 + 2.6 * (0.05 * 0.95 / 1000) ** 0.5


@pytest.mark.parametrize("name", [s.name for s in SEARCHES.values() if s.guarantee_kind == "high-probability"])
def test_every_registered_search_that_claims_a_guarantee_keeps_its_fwer_on_an_adversarial_law(name: str) -> None:
    """A registry-level check every high-probability search passes, so an invalid one cannot be added in silence."""
    assert _violations(get_search(name)) <= FWER_LIMIT


def test_the_registry_check_fails_a_search_without_a_multiplicity_correction() -> None:
    """The check can fail: Algorithm 1 as printed (every score at delta), as a search claiming a guarantee, does."""
    from dataclasses import replace

    uncorrected = replace(get_search("paper"), name="uncorrected", guarantee_kind="high-probability")
    assert _violations(uncorrected) > 2 * FWER_LIMIT


@pytest.mark.parametrize("shares", [(0.6, 0.1, 0.3), (0.4, 0.1, 0.2, 0.3), None])
@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.6, 0.88, 0.97])
def test_the_fallback_entries_share_exactly_delta_whatever_the_shares_n_and_alpha(shares: tuple[float, ...] | None,
                                                                                  alpha: float) -> None:
    """The FWER bound is the sum of the entries' shares: it is delta (never more, none lost) for three or four
    shares (None: the default search's own), at every n from a handful of answers to 10^6 and alpha near 0 or 1."""
    from cic.stats.searches import Setting, fallback_entries

    search = get_search("fallback")
    for n in (30, 300, 2_000, 10_000, 1_000_000):
        for bound in ("cp", "hoeffding"):
            entries = (search.entries(Setting(n, bound, alpha), 0.05) if shares is None
                       else fallback_entries(n, bound, alpha, 0.05, shares))
            assert sum(w for _, w in entries) == pytest.approx(0.05, abs=1e-12), (n, bound, entries)
            assert all(w > 0 for _, w in entries) and [c for c, _ in entries] == sorted({c for c, _ in entries})


@pytest.mark.parametrize("shares", [(0.7, 0.2, 0.2), (0.5, 0.1, 0.2, 0.3), (0.6, 0.4), (0.6, -0.1, 0.5)])
def test_fallback_shares_past_delta_or_malformed_are_refused(shares: tuple[float, ...]) -> None:
    from cic.stats.searches import fallback_entries

    with pytest.raises(UserError, match="fallback shares"):
        fallback_entries(1_000, "cp", 0.1, 0.05, shares)


def test_the_bottom_entry_scales_with_alpha_near_one() -> None:
    """Below alpha = 1/2 the bottom entry is where an empirical risk of alpha/2 certifies; near alpha = 1 it is
    where alpha - (1 - alpha)/2 does, so its share is not spent on a 2-answer test that a threshold whose risk is
    just under alpha almost never passes. On 300 answers wrong 78% of the time at the lowest score rising to 90% at
    the highest (84% overall; the two most confident wrong), alpha = 0.88, the entry at 2 answers fails at once and
    what is left of delta certifies nothing; the scaled entry certifies every answer."""
    from cic.stats import bounds
    from cic.stats.searches import Fallback, Setting

    assert bounds.margin_n("cp", 0.1, 0.03) == bounds.half_alpha_n("cp", 0.1, 0.03)
    assert bounds.half_alpha_n("cp", 0.88, 0.03) <= 2 < 50 < bounds.margin_n("cp", 0.88, 0.03)
    search = get_search("fallback")
    first, share = search.entries(Setting(1_000, "cp", 0.88), 0.05)[0]
    assert first >= 50 and share >= 0.5 * 0.05
    scores = np.linspace(0.0, 1.0, 300)
    errors = ((np.arange(300) * 0.6180339887) % 1 < 0.78 + 0.12 * scores).astype(int)  # evenly spread
    errors[:2] = 1
    unscaled = Fallback("fallback[half]", search.label, search.guarantee, search.guarantee_kind, takes_grid=False,
                        first_test=True, shares=search.shares, grid_entries=search.grid_entries,
                        coarse_entries=search.coarse_entries, scaled=False)
    assert cic.calibrate(scores, errors, alpha=0.88, search=unscaled).threshold is None
    assert cic.calibrate(scores, errors, alpha=0.88).threshold == 1.0
