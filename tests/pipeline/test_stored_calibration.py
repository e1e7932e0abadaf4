"""Calibration of stored runs: gate rows equal cic.calibrate, evaluation rows equal evaluate_splits, idempotent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from cic.pipeline.config import CalibrationConfig, GridConfig
from cic.pipeline.recalibration import recalibrate_group
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


def test_recalibration_compares_with_the_previous_gate_and_flags_shift_and_unattainable(store: Store) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    key = store_run(store, n=300, labelled_at=start)
    run = store.read("runs").row(0, named=True)
    group = groups_of_run(store, run, estimators=["semantic_entropy"])[0]
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), n_splits=5)
    first_rows, first = recalibrate_group(store, group, config, window=None, shift_p_value=0.01)
    store.upsert("calibrations", first_rows)
    assert first[0].previous is None and first[0].drift is None
    # a later window: scores moved up and every answer is wrong
    store_run(store, n=300, labelled_at=start + timedelta(days=7), id_offset=1000, shift=0.5, base=1.0, seed=1)
    rows, found = recalibrate_group(store, group, config, window=300, shift_p_value=0.01)
    item = found[0]
    assert item.row["run_key"] == key and item.row["n_cal"] == 300 and item.row["kind"] == "recalibration"
    assert item.previous is not None and item.previous["calibration_id"] == first_rows["calibration_id"][0]
    assert item.row["threshold"] is None and item.drift is not None
    assert item.drift.became_unattainable and item.drift.shift_detected
    assert any("unattainable" in a for a in item.alerts) and any("shifted" in a for a in item.alerts)
    assert item.row["window_from"] >= start + timedelta(days=7)


def test_recalibration_needs_labelled_data(store: Store) -> None:
    store_run(store, n=300)
    run = store.read("runs").row(0, named=True)
    group = groups_of_run(store, run)[0]
    with pytest.raises(ValueError, match="only 1 labelled question"):
        recalibrate_group(store, group, CONFIG, window=1, shift_p_value=0.01)


@pytest.mark.faults
def test_a_stored_gate_that_was_altered_is_not_served(tmp_path: Path) -> None:
    """Editing an unattainable gate's threshold from NULL to 1e9 must not make `cic ask` answer."""
    from cic.pipeline.asking import latest_gate

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=300)
        run = store.read("runs", run_key=key).row(0, named=True)
        group = groups_of_run(store, run)[0]
        pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                        run_key=key, allow_partial=True)
        store.upsert("calibrations", calibration_rows(group, pairs, CalibrationConfig(alphas=(0.01, 0.3),
                                                                                      bounds=("cp",))))
    ask = dict(model=group.model, dataset=group.dataset, estimator=group.estimator, criterion=group.criterion,
               bound="cp", search="fixed_sequence")
    assert latest_gate(str(db), alpha=0.3, **ask)["threshold"] is not None  # an intact gate is served
    raw_sql(db, "UPDATE calibrations SET threshold = 1e9 WHERE alpha = 0.01",
            "UPDATE calibrations SET n_errors = 0 WHERE alpha = 0.3")  # edits behind the store's back
    with pytest.raises(ValueError, match="column threshold = 1000000000.0 but its certified result says None"):
        latest_gate(str(db), alpha=0.01, **ask)
    with pytest.raises(ValueError, match="column n_errors = 0"):
        latest_gate(str(db), alpha=0.3, **ask)
