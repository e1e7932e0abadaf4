"""One loop for every sequential search (`cic.stats.sequential`): the three paths it generates — many calibration
sets through the feasibility tables, one set through them in chunks, one set by lazy exact tests — choose the same
candidate at the same level for every sequential search, and a search written as hooks alone equals its literal
procedure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import cic
from cic.stats.searches import Search, Setting, candidate_matrix, get_search, run_search
from cic.stats.sequential import Chain, SequentialHooks
from tests.support import reference
from tests.support.tables import make_table

SEQUENTIAL = ["fixed_sequence", "multistart", "multistart[3]", "geometric", "fallback"]


def _paths(search: Search, u: np.ndarray, e: np.ndarray, setting: Setting) -> dict[str, tuple[list, list]]:
    values, n, fd, candidate = candidate_matrix(u, np.cumsum(e, axis=1))
    rows = u.shape[0]
    together = run_search(search, values, n, fd, setting=setting, delta=0.05, candidate=candidate)
    alone = [run_search(search, values[i], n[i], fd[i], setting=setting, delta=0.05, candidate=candidate[i])
             for i in range(rows)]
    lazy = [run_search(search, values[i][candidate[i]], n[i][candidate[i]], fd[i][candidate[i]], setting=setting,
                       delta=0.05, lazy=True) for i in range(rows)]
    back = [np.flatnonzero(candidate[i]) for i in range(rows)]  # the lazy path saw the eligible candidates alone
    return {"tables, every set at once": (together.index.tolist(), together.level.tolist()),
            "tables, one set": ([int(o.index[0]) for o in alone], [float(o.level[0]) for o in alone]),
            "lazy exact tests": ([int(back[i][o.index[0]]) if o.index[0] >= 0 else -1 for i, o in enumerate(lazy)],
                                 [float(o.level[0]) for o in lazy])}


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_the_three_paths_choose_the_same_candidate_at_the_same_level(name: str, rng: np.random.Generator) -> None:
    search = get_search(name)
    chosen = 0
    for trial in range(12):
        n = int(rng.integers(60, 700))
        u = rng.random((5, n))
        if trial % 2:  # ties (sets then differ in their tied entries: one set at a time); else every set at once
            u = np.round(u, int(rng.choice([1, 2, 3])))
        u = np.sort(u, axis=1)
        p = 0.03 + 0.4 * u + (0.5 * (u < 0.04) if trial % 3 == 0 else 0)  # a confident-but-wrong cluster
        e = (rng.random(u.shape) < p).astype(np.int64)
        setting = Setting(n, str(rng.choice(["cp", "hoeffding"])), float(rng.choice([0.15, 0.2, 0.3, 0.45, 0.88])))
        got = _paths(search, u, e, setting)
        first = next(iter(got.values()))
        for path, (index, level) in got.items():
            assert index == first[0] and np.allclose(level, first[1], equal_nan=True), (trial, path)
        chosen += sum(i >= 0 for i in first[0])
    assert chosen > 0


@dataclass(frozen=True)
class TwoChains(SequentialHooks, Search):
    """A search written as hooks alone: a chain from the 30th accepted answer at 0.8·delta and one from half the
    calibration set at 0.2·delta (a union bound: FWER <= delta)."""

    def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
        assert setting is not None
        return Chain(30, 0.8 * delta), Chain(-(-setting.n_calibration // 2), 0.2 * delta)


TWO_CHAINS = TwoChains("two_chains", "two chains", "FWER <= delta: two fixed-sequence chains (union bound)",
                       "high-probability", takes_grid=False)


def test_a_search_written_as_hooks_alone_equals_its_literal_procedure_on_every_path(rng: np.random.Generator) -> None:
    for trial in range(15):
        n = int(rng.integers(150, 600))
        scores, errors = make_table(rng, n, decimals=int(rng.choice([2, 3])), slope=0.4, base=0.02)
        got = cic.calibrate(scores, errors, alpha=0.2, bound="cp", search=TWO_CHAINS)
        chains = [(30, 0.8 * 0.05), (-(-n // 2), 0.2 * 0.05)]
        assert got.threshold == reference.geometric(scores, errors, 0.2, 0.05, "cp", chains), trial
    u = np.sort(np.round(rng.random((4, 400)), 2), axis=1)
    e = (rng.random(u.shape) < 0.03 + 0.4 * u).astype(np.int64)
    got = _paths(TWO_CHAINS, u, e, Setting(400, "cp", 0.2))
    assert len({str(v) for v in got.values()}) == 1 and max(got["lazy exact tests"][0]) >= 0


def test_a_segment_passed_whole_hands_its_level_on_and_one_that_fails_does_not() -> None:
    """The graphical line's update, pinned on a table built for it: the first segment (no errors) passes whole and
    its level carries into the second, which then certifies further than on its own share."""
    from tests.support.reference import literal_ucb

    n = 400
    scores = np.arange(n) / n
    errors = np.zeros(n, dtype=int)
    errors[[250, 260, 270, 280, 290, 300, 310, 320, 330, 340]] = 1  # the second segment is hard at a small level

    @dataclass(frozen=True)
    class Line(SequentialHooks, Search):
        inherit: bool = True

        def chains(self, setting: Setting | None, delta: float, counts: np.ndarray | None = None) -> tuple[Chain, ...]:
            return (Chain(80, 0.049, inherits=True, segment=True),
                    Chain(200, 0.001, inherits=self.inherit, segment=True))

    line = Line("line", "line", "FWER <= delta (a graphical line)", "high-probability", takes_grid=False)
    apart = Line("apart", "apart", "FWER <= delta (two chains)", "high-probability", takes_grid=False, inherit=False)
    carried = cic.calibrate(scores, errors, alpha=0.05, bound="cp", search=line)
    alone = cic.calibrate(scores, errors, alpha=0.05, bound="cp", search=apart)
    assert carried.gamma == pytest.approx(0.05) and carried.n_accepted > 200  # the whole level moved on
    assert alone.n_accepted <= 200 or alone.gamma == pytest.approx(0.001)
    assert literal_ucb("cp", carried.n_errors, carried.n_accepted, 0.05) <= 0.05
    assert carried.n_accepted > alone.n_accepted
