"""One search pipeline: calibrate, the split protocol and the simulator choose the same threshold on the same
calibration set, for every search and every option (grid, n_min, start on a score or between scores), with ties."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import cic
from cic.stats.searches import SEARCH_NAMES, get_search
from tests.support.tables import make_table

GRID = np.linspace(0.05, 1.0, 12)


def options(search: str) -> list[dict]:
    """Every option combination the search takes."""
    plan = get_search(search)
    if plan.needs_grid:
        return [{"grid": GRID}]
    found: list[dict] = [{}]
    if plan.first_test:
        found += [{"n_min": 25}, {"start": 0.3}, {"start": 0.1234}, {"start": 0.3, "n_min": 40}]
        if plan.takes_grid:
            found += [{"grid": GRID, "start": 0.2}]
    return found


CASES = [(search, kwargs) for search in [*SEARCH_NAMES, "multistart[3]"] for kwargs in options(search)]
IDS = [f"{s}-{'-'.join(sorted(k)) or 'default'}" for s, k in CASES]


@dataclass(frozen=True)
class RoundedScores:
    """PowerRisk with scores rounded to two decimals: ties, and a `start` of 0.3 lands on a score."""

    inner: cic.PowerRisk = cic.PowerRisk(0.02, 0.5)

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        u = np.round(np.sort(rng.random(shape), axis=-1), 2)
        return u, (rng.random(shape) < self.inner.conditional_risk(u)).astype(np.int8)

    def selection_risk(self, t: np.ndarray) -> np.ndarray:
        return self.inner.selection_risk(t)

    def acceptance(self, t: np.ndarray) -> np.ndarray:
        return self.inner.acceptance(t)

    def oracle_threshold(self, alpha: float) -> float | None:
        return self.inner.oracle_threshold(alpha)


@pytest.mark.parametrize("search,kwargs", CASES, ids=IDS)
def test_the_protocol_chooses_what_calibrate_chooses_on_each_split(search: str, kwargs: dict) -> None:
    scores, errors = make_table(np.random.default_rng(11), 700, decimals=2, base=0.02)
    rows = cic.split_outcomes(scores, errors, alphas=[0.15, 0.25], bounds=["cp", "hoeffding"], search=search,
                              n_splits=5, seed=2, **kwargs)
    masks = cic.split_masks(700, 5, 0.5, seed=2)
    checked = 0
    for row in rows.iter_rows(named=True):
        cal = masks[row["split"]]
        direct = cic.calibrate(scores[cal], errors[cal], alpha=row["alpha"], bound=row["bound"], search=search,
                               keep_table=False, **kwargs)
        assert row["threshold"] == direct.threshold, row
        checked += direct.threshold is not None
    assert checked > 0  # the comparison saw certified thresholds, not only "unattainable"


@pytest.mark.parametrize("search,kwargs", CASES, ids=IDS)
def test_the_simulator_chooses_what_calibrate_chooses_on_each_draw(search: str, kwargs: dict) -> None:
    model, n, trials, alpha = RoundedScores(), 300, 40, 0.2
    result = cic.simulate(model, n=n, alpha=alpha, bound="cp", search=search, n_trials=trials, seed=4, **kwargs)
    u, e = model.sample(np.random.default_rng(4), (trials, n))  # the simulator's draws (one block)
    chosen = [cic.calibrate(u[i], e[i], alpha=alpha, bound="cp", search=search, keep_table=False,
                            **kwargs).threshold for i in range(trials)]
    found = [t for t in chosen if t is not None]
    assert result.fails == trials - len(found)
    assert found, "nothing certified: the comparison would be empty"
    assert result.mean_threshold == pytest.approx(float(np.mean(found)), abs=1e-12)
