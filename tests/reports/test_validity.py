"""The validity study: rows agree with cic.simulate, identities that must hold, files written."""

from __future__ import annotations

from pathlib import Path

import pytest

import cic
from cic.errors import UserError
from cic.reports.validity import SCENARIOS, validity_study, write_validity
from cic.stats.searches import SEARCH_NAMES

SMALL = dict(ns=(150, 400), alphas=(0.1,), n_trials=300, bounds=("cp",))


def test_rows_are_simulate_results_for_each_configuration() -> None:
    table = validity_study(**SMALL)
    assert table.height == 2 * 2 * len(SEARCH_NAMES)  # scenarios x ns x searches (one alpha, one bound)
    row = table.filter(scenario="crossing", n=400, search="bonferroni").row(0, named=True)
    direct = cic.simulate(cic.PowerRisk(0.0, 0.4), n=400, alpha=0.1, bound="cp", search="bonferroni",
                          n_trials=300, grid=cic.uniform_grid(0.05, 1.0, 20))
    assert (row["n_violations"], row["fails"], row["ci_low"], row["ci_high"]) == (
        direct.n_violations, direct.fails, direct.ci_low, direct.ci_high)


def test_flat_scenario_every_certificate_is_a_violation() -> None:
    # R = 1.2 alpha everywhere: a trial either fails or violates
    table = validity_study(**SMALL).filter(scenario="flat")
    assert (table["n_violations"] + table["fails"] == table["n_trials"]).all()
    assert table.filter(search="paper")["n_violations"].sum() > 0


def test_verdicts_follow_the_confidence_interval() -> None:
    for r in validity_study(**SMALL).iter_rows(named=True):
        assert r["ci_low"] <= r["violation_rate"] <= r["ci_high"]
        expected = ("exceeds delta" if r["ci_low"] > r["delta"] else
                    "below delta" if r["ci_high"] <= r["delta"] else "consistent with delta")
        assert r["verdict"] == expected


def test_scenarios_scale_with_alpha() -> None:
    assert SCENARIOS["crossing"].model(0.2) == cic.PowerRisk(0.0, 0.8, 1.0)
    assert SCENARIOS["crossing"].model(0.1).oracle_threshold(0.1) == pytest.approx(0.5)
    with pytest.raises(UserError, match="needs alpha <= 0.25"):
        validity_study(alphas=(0.3,), ns=(100,), n_trials=10)
    with pytest.raises(UserError, match="scenario = 'steep'"):
        validity_study(scenarios=("steep",))


def test_write_validity_writes_table_plot_and_index(tmp_path: Path) -> None:
    table, written = write_validity(tmp_path / "v", ns=(150,), alphas=(0.1,), n_trials=100, searches=("paper",))
    names = sorted(p.name for p in written)
    assert names == ["README.md", "validity.csv", "validity.md", "validity.png"]
    assert (tmp_path / "v" / "validity.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "v" / "validity.md").read_text()
    assert md.count("\n| crossing |") == 2 and "violation rate [95% CI]" in md
    assert "![violation rates](validity.png)" in (tmp_path / "v" / "README.md").read_text()
