"""Calibration of stored runs: gate rows equal cic.calibrate, evaluation rows equal evaluate_splits, idempotent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cic.pipeline.config import CalibrationConfig, GridConfig
from cic.pipeline.stored_calibration import (
    calibration_rows,
    evaluation_rows,
    groups_of_run,
    iter_group_pairs,
    stored_run_keys,
)
from cic.stats.calibration import calibrate
from cic.stats.protocol import evaluate_splits
from cic.store import Store
from tests.support.database import raw_sql
from tests.support.pipeline_data import store_run

CONFIG = CalibrationConfig(alphas=(0.2, 0.3), bounds=("hoeffding", "cp"), searches=("paper",), n_splits=20)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "t.duckdb") as opened:
        yield opened


def test_groups_are_every_scored_estimator_times_every_criterion(store: Store) -> None:
    key = store_run(store)
    run = store.read("runs", run_key=key).row(0, named=True)
    groups = groups_of_run(store, run)
    assert [(g.estimator, g.criterion) for g in groups] == [
        ("predictive_entropy", "similarity[0.6]"), ("semantic_entropy[embedding:0.9]", "similarity[0.6]")]
    assert [g.estimator for g in groups_of_run(store, run, estimators=["semantic_entropy"])] == [
        "semantic_entropy[embedding:0.9]"]
    assert stored_run_keys(store, ["m"], ["d"]) == [key]
    with pytest.raises(ValueError, match="holds no runs of models \\['other'\\]"):
        stored_run_keys(store, ["other"], ["d"])


def test_gate_and_protocol_rows_match_the_core_functions(store: Store) -> None:
    key = store_run(store)
    run = store.read("runs", run_key=key).row(0, named=True)
    group, pairs = next(iter_group_pairs(store, groups_of_run(store, run)))
    rows = calibration_rows(group, pairs, CONFIG)
    assert rows.height == 4
    scores, errors = pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy()
    for row in rows.iter_rows(named=True):
        direct = calibrate(scores, errors, alpha=row["alpha"], bound=row["bound"], search="paper")
        assert row["threshold"] == direct.threshold and row["n_accepted"] == direct.n_accepted
        assert row["run_key"] == key and row["kind"] == "pipeline" and row["n_cal"] == 400
    evaluations = evaluation_rows(group, pairs, CONFIG)
    direct = evaluate_splits(scores, errors, alphas=CONFIG.alphas, bounds=CONFIG.bounds, n_splits=20)
    assert evaluations.height == 4
    assert np.allclose(evaluations.sort("alpha", "bound").get_column("coverage_mean").to_numpy(),
                       direct.sort("alpha", "bound").get_column("coverage_mean").to_numpy())
    # identical work gives identical keys: storing twice adds nothing
    for _ in range(2):
        store.upsert("calibrations", calibration_rows(group, pairs, CONFIG))
        store.upsert("evaluations", evaluation_rows(group, pairs, CONFIG))
    assert store.count("calibrations") == 4 and store.count("evaluations") == 4


def test_bonferroni_grid_comes_from_a_pilot_share_it_never_calibrates_on(store: Store) -> None:
    store_run(store)
    run = store.read("runs").row(0, named=True)
    group, pairs = next(iter_group_pairs(store, groups_of_run(store, run)))
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("bonferroni",), n_splits=5,
                               grid=GridConfig(kind="pilot_quantiles", k=10, pilot_fraction=0.25))
    row = calibration_rows(group, pairs, config).row(0, named=True)
    assert row["n_cal"] == 300  # 400 minus the 100-question pilot
    assert row["threshold"] is not None


@pytest.mark.faults
def test_a_stored_gate_that_was_altered_is_not_served(tmp_path: Path) -> None:
    """Editing an unattainable gate's threshold from NULL to 1e9 must not make `cic ask` answer."""
    from cic.pipeline.asking import serving_gate
    from cic.pipeline.gates import promote_first_gates

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=300)
        run = store.read("runs", run_key=key).row(0, named=True)
        group = groups_of_run(store, run)[0]
        pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                        run_key=key, allow_partial=True)
        rows = calibration_rows(group, pairs, CalibrationConfig(alphas=(0.01, 0.3), bounds=("cp",)))
        store.upsert("calibrations", rows)
        promote_first_gates(store, rows.get_column("calibration_id"), reason="test")
    ask = dict(model=group.model, dataset=group.dataset, estimator=group.estimator, criterion=group.criterion,
               bound="cp", search="fixed_sequence")
    assert serving_gate(str(db), alpha=0.3, **ask)["threshold"] is not None  # an intact gate is served
    raw_sql(db, "UPDATE calibrations SET threshold = 1e9 WHERE alpha = 0.01",
            "UPDATE calibrations SET n_errors = 0 WHERE alpha = 0.3")  # edits behind the store's back
    with pytest.raises(ValueError, match="column threshold = 1000000000.0 but its certified result says None"):
        serving_gate(str(db), alpha=0.01, **ask)
    with pytest.raises(ValueError, match="column n_errors = 0"):
        serving_gate(str(db), alpha=0.3, **ask)
