"""Per-group certification: each group is calibrated on its own data at delta / G; a group too small is
reported with its size (or served the pooled gate, labelled so); by simulation, some group's true error rate
exceeds alpha in at most delta of repetitions, where the pooled gate fails the worse group most of the time."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats.groups import calibrate_groups, group_validity


def test_each_group_is_its_own_calibration_at_delta_over_g() -> None:
    rng = np.random.default_rng(0)
    scores = rng.random(3000)
    groups = np.array(["a", "b", "c"])[rng.integers(0, 3, 3000)]
    errors = (rng.random(3000) < 0.02 + 0.4 * scores + 0.06 * (groups == "c")).astype(int)
    fitted = calibrate_groups(scores, errors, groups, alpha=0.2, delta=0.06, n_min=150)
    assert [g.group for g in fitted.groups] == ["a", "b", "c"]
    for gate in fitted.groups:
        mask = groups == gate.group
        direct = cic.calibrate(scores[mask], errors[mask], alpha=0.2, delta=0.02, n_min=150)
        assert gate.threshold == direct.threshold and gate.size == mask.sum() and gate.result.gamma == direct.gamma
    assert fitted.pooled == cic.calibrate(scores, errors, alpha=0.2, delta=0.06, n_min=150, keep_table=False)
    assert fitted.threshold_of("c") < fitted.threshold_of("a")  # the worse group is served a stricter gate


def test_a_group_too_small_is_unattainable_with_its_size_or_served_the_pooled_gate_labelled() -> None:
    rng = np.random.default_rng(1)
    scores = rng.random(2005)
    groups = np.array(["big"] * 2000 + ["tiny"] * 5)
    errors = (rng.random(2005) < 0.3 * scores).astype(int)
    strict = calibrate_groups(scores, errors, groups, alpha=0.2)
    tiny = {r["group"]: r for r in strict.as_rows()}["tiny"]
    assert tiny["size"] == 5 and tiny["served"] == "none" and tiny["threshold"] is None
    lenient = calibrate_groups(scores, errors, groups, alpha=0.2, pooled_fallback=True)
    tiny = {r["group"]: r for r in lenient.as_rows()}["tiny"]
    assert tiny["served"] == "pooled" and tiny["threshold"] == lenient.pooled.threshold
    assert tiny["certified_threshold"] is None
    with pytest.raises(UserError, match="groups has 3 entries for 2005 scores"):
        calibrate_groups(scores, errors, groups[:3], alpha=0.2)


@pytest.mark.slow
def test_by_simulation_every_group_is_controlled_where_the_pooled_gate_fails_the_worse_one() -> None:
    from scipy.stats import binom

    study = group_validity(repetitions=300, seed=2)
    assert study["per_group_violation"] * 300 <= binom.ppf(0.999, 300, study["delta"])
    assert study["pooled_violation"] > 3 * study["delta"]
    assert study["worse_group_coverage_pooled"] > study["worse_group_coverage_per_group"]


def test_the_per_group_split_protocol_shows_the_pooled_gate_failing_the_worse_group() -> None:
    from cic.stats.groups import evaluate_group_splits

    rng = np.random.default_rng(3)
    labels = np.array(["a"] * 4000 + ["worse"] * 2000)
    scores = rng.random(6000)
    errors = (rng.random(6000) < 0.02 + 0.4 * scores + 0.12 * (labels == "worse")).astype(int)
    rows = evaluate_group_splits(scores, errors, labels, alphas=(0.2,), delta=0.1, n_splits=20, n_min=200)
    table = {(r["group"], r["gate"]): r for r in rows}
    assert set(table) == {("a", "per_group"), ("a", "pooled"), ("worse", "per_group"), ("worse", "pooled")}
    assert all(r["n_splits"] == 20 and r["size"] in (4000, 2000) for r in rows)
    pooled, own = table[("worse", "pooled")], table[("worse", "per_group")]
    assert pooled["fdr_mean"] > 0.2 and pooled["fdr_above_alpha"] > 0.5  # the pool's gate is too lax for it
    assert own["fails"] == 20 or own["fdr_mean"] <= 0.2 + 0.03  # its own gate holds (or abstains)
    assert own["coverage_mean"] < pooled["coverage_mean"]
