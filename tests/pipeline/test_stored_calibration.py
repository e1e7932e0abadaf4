"""Calibration of stored runs: gate rows equal cic.calibrate, evaluation rows equal evaluate_splits, idempotent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig, GridConfig
from cic.pipeline.run.stored_calibration import (
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
    with pytest.raises(UserError, match="holds no runs of models \\['other'\\]"):
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
    direct = evaluate_splits(scores, errors, alphas=CONFIG.alphas, bounds=CONFIG.bounds, n_splits=20, search="paper")
    assert evaluations.height == 4
    assert np.allclose(evaluations.sort("alpha", "bound").get_column("coverage_mean").to_numpy(),
                       direct.sort("alpha", "bound").get_column("coverage_mean").to_numpy())
    # identical work gives identical keys: storing twice adds nothing
    for _ in range(2):
        store.upsert("calibrations", calibration_rows(group, pairs, CONFIG))
        store.upsert("evaluations", evaluation_rows(group, pairs, CONFIG))
    assert store.count("calibrations") == 4 and store.count("evaluations") == 4


def test_a_search_is_looked_up_once_per_config_and_travels_down_as_its_object(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config resolves each search name once (`CalibrationConfig.plans`); a group's gates and split protocol
    over every alpha and bound pass that `Search` down and never look the name up again — the rows are the same
    as when the statistics are given the name."""
    from cic.stats import searches

    config = CalibrationConfig(alphas=(0.1, 0.2), bounds=("hoeffding", "cp"), searches=("fallback", "bonferroni"),
                               n_splits=3)
    key = store_run(store)
    run = store.read("runs", run_key=key).row(0, named=True)
    group, pairs = next(iter_group_pairs(store, groups_of_run(store, run)))
    assert [p.name for p in config.plans] == ["fallback", "bonferroni"] and config.plans is config.plans
    looked_up: list[str] = []
    real = searches.SEARCHES.find
    monkeypatch.setattr(searches.SEARCHES, "find", lambda name: looked_up.append(name) or real(name))
    rows, evaluations = calibration_rows(group, pairs, config), evaluation_rows(group, pairs, config)
    assert looked_up == [] and rows.height == evaluations.height == 8
    assert set(rows.get_column("search")) == {"fallback", "bonferroni"}
    scores, errors = pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy()
    row = rows.filter(search="fallback", alpha=0.2, bound="cp").row(0, named=True)
    assert row["threshold"] == calibrate(scores, errors, alpha=0.2, bound="cp", search="fallback").threshold


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
    from cic.pipeline.gates.asking import serving_gate
    from cic.pipeline.gates.lifecycle import promote_first_gates

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
               bound="cp", search="fallback")
    assert serving_gate(str(db), alpha=0.3, **ask)["threshold"] is not None  # an intact gate is served
    raw_sql(db, "UPDATE calibrations SET threshold = 1e9 WHERE alpha = 0.01",
            "UPDATE calibrations SET n_errors = 0 WHERE alpha = 0.3")  # edits behind the store's back
    with pytest.raises(UserError, match="column threshold = 1000000000.0 but its certified result says None"):
        serving_gate(str(db), alpha=0.01, **ask)
    with pytest.raises(UserError, match="column n_errors = 0"):
        serving_gate(str(db), alpha=0.3, **ask)


def test_gates_certified_together_share_delta_and_say_so(tmp_path: Path) -> None:
    """`group_by: dataset`: each of G datasets' gates is certified at delta / G; the row keeps the family's delta
    and G, its id differs from the gate certified alone, and serving checks the result against delta / G."""
    from cic.pipeline.gates.asking import serving_gate
    from cic.pipeline.gates.lifecycle import promote_first_gates, verify_gate
    from cic.pipeline.run.stored_calibration import group_counts

    db = tmp_path / "g.duckdb"
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("fixed_sequence",), group_by="dataset")
    with Store.open(db) as store:
        keys = [store_run(store, dataset=name, n=300, seed=i) for i, name in enumerate(("d", "e", "f"))]
        runs = store.read("runs").to_dicts()
        assert group_counts(runs, config) == {"m": 3}
        assert group_counts(runs, CalibrationConfig()) == {"m": 1}
        group = groups_of_run(store, next(r for r in runs if r["run_key"] == keys[0]))[0]
        pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                        run_key=keys[0], allow_partial=True)
        together = calibration_rows(group, pairs, config, groups=3).row(0, named=True)
        alone = calibration_rows(group, pairs, config).row(0, named=True)
        direct = calibrate(pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy(), alpha=0.3,
                           delta=0.05 / 3, bound="cp", search="fixed_sequence")
        assert together["threshold"] == direct.threshold and together["n_accepted"] == direct.n_accepted
        assert together["delta"] == 0.05 and together["groups"] == 3 and alone["groups"] is None
        assert together["calibration_id"] != alone["calibration_id"]
        assert alone["threshold"] >= together["threshold"]  # a smaller share of delta certifies no more
        verify_gate(together)
        with pytest.raises(UserError, match="column delta = 0.05 but its certified result says 0.01666"):
            verify_gate({**together, "groups": 1})  # G lost: the stored result no longer matches the row
        store.upsert("calibrations", calibration_rows(group, pairs, config, groups=3))
        promote_first_gates(store, [together["calibration_id"]], reason="test")
    served = serving_gate(str(db), model="m", dataset="d", estimator=group.estimator, criterion=group.criterion,
                          alpha=0.3, bound="cp", search="fixed_sequence")
    assert served["calibration_id"] == together["calibration_id"]
    raw_sql(db, "UPDATE calibrations SET groups = 1")
    with pytest.raises(UserError, match="column delta = 0.05 but its certified result says 0.0166"):
        serving_gate(str(db), model="m", dataset="d", estimator=group.estimator, criterion=group.criterion,
                     alpha=0.3, bound="cp", search="fixed_sequence")


def test_per_dataset_study_judges_per_dataset_gates_and_the_pooled_gate(store: Store) -> None:
    from cic.pipeline.run.stored_calibration import group_evaluation_rows

    for i, (name, base) in enumerate((("easy", 0.02), ("hard", 0.3))):
        store_run(store, dataset=name, n=400, seed=i, base=base)
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("fixed_sequence",), n_splits=10)
    parts = [(g, p) for g, p in iter_group_pairs(store, [g for r in store.read("runs").to_dicts()
                                                           for g in groups_of_run(store, r)])
             if g.estimator == "predictive_entropy"]
    rows = group_evaluation_rows(parts, config)
    assert sorted(set(zip(rows["dataset"], rows["gate"], strict=True))) == [
        ("easy", "per_group"), ("easy", "pooled"), ("hard", "per_group"), ("hard", "pooled")]
    assert set(rows["size"]) == {400} and set(rows["n_splits"]) == {10}
    store.upsert("group_evaluations", rows)
    store.upsert("group_evaluations", group_evaluation_rows(parts, config))  # same data, same keys
    assert store.count("group_evaluations") == rows.height
