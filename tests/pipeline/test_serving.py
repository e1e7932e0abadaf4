"""`cic.pipeline.gates.serving`: which gate answers for a key asked, for either kind of gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.gates.serving import live_gate
from cic.store import Store
from tests.support.pipeline_data import store_run

CONFIG = CalibrationConfig(alphas=(0.2,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4)


def test_a_key_asked_by_base_name_that_two_live_gates_match_is_refused_naming_both(tmp_path: Path) -> None:
    """Never the newer of two gates by accident: an estimator's base name matching two stored estimators (or a
    criterion left out that two gates differ in) names the values to choose from; the full name serves."""
    db = tmp_path / "t.duckdb"
    names = ("semantic_entropy[embedding:0.9]", "semantic_entropy[embedding:0.8]")
    with Store.open(db) as store:
        keys = [store_run(store, n=500, seed=1, estimators=names)]
    calibrate_store(str(db), keys, CONFIG)
    asked = {"model": "m", "dataset": "d", "criterion": None, "alpha": 0.2, "bound": "cp", "search": "fixed_sequence"}
    with Store.open(db, read_only=True) as store:
        with pytest.raises(UserError, match=r"gates of several keys speak for it \(estimator: "
                                            r"semantic_entropy\[embedding:0.8\], semantic_entropy\[embedding:0.9\]\)"
                                            r"; pass --estimator"):
            live_gate(store, estimator="semantic_entropy", **asked)
        row = live_gate(store, estimator=names[1], **asked)
    assert row.estimator == names[1] and row.state == "live"


def test_gates_that_differ_only_in_what_cic_ask_cannot_name_serve_the_newest(tmp_path: Path) -> None:
    """Two live gates of one (model, dataset, estimator, criterion, alpha, bound, search) that differ in delta (the
    config's delta changed between runs; `cic ask` has no --delta): the newest serves, as before — the refusal is
    kept for what a caller can name."""
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, n=500, seed=1, estimators=("predictive_entropy",))]
    calibrate_store(str(db), keys, CONFIG)
    calibrate_store(str(db), keys, CONFIG.model_copy(update={"delta": 0.1}))
    asked = {"model": "m", "dataset": "d", "estimator": "predictive_entropy", "criterion": None, "alpha": 0.2,
             "bound": "cp", "search": "fixed_sequence"}
    with Store.open(db, read_only=True) as store:
        assert sorted(gates(store).filter(state="live").get_column("delta").to_list()) == [0.05, 0.1]
        assert live_gate(store, **asked).delta == 0.1


def test_a_miss_names_the_keys_that_serve_here_and_an_empty_store_says_where_gates_come_from(tmp_path: Path) -> None:
    """Advice for a production store too: a model or stream with no gate lists the (model, dataset) pairs that
    serve in this store; a store where nothing serves yet names both ways gates come (`cic run`, or `cic
    recalibrate` then `cic gate promote`)."""
    from cic.pipeline.gates.serving import serving_here

    empty = tmp_path / "empty.duckdb"
    with Store.open(empty) as store:
        store_run(store, n=200, seed=2, estimators=("semantic_entropy",))
        said = serving_here(store, "served", "web")
    assert "none serves in this store yet" in said and "cic recalibrate" in said
    assert "`" not in said  # nothing to run as printed here: no gate waits for review
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, n=500, seed=1, estimators=("semantic_entropy",))]
    calibrate_store(str(db), keys, CONFIG)
    with Store.open(db, read_only=True) as store:
        assert serving_here(store, "served", "web").endswith("gates serve here for: --model m --dataset d")
