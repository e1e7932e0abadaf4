"""A stored gate typed once from its row: columns as attributes, the pass's state and alerts, the same gate."""

from __future__ import annotations

from pathlib import Path

from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.gate_rows import GateRow
from cic.pipeline.gates.lifecycle import find_gate, gate_of, gates, promote, retire
from cic.pipeline.gates.serving import live_gate
from cic.stats.calibration import CalibrationResult
from cic.store import Store
from tests.support.pipeline_data import store_run


def test_a_stored_gate_row_is_typed_once_and_serves_the_same_gate(tmp_path: Path) -> None:
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=300)
    calibrate_store(str(db), [key], CalibrationConfig(alphas=(0.3,), bounds=("cp",), n_splits=5))
    with Store.open(db, read_only=True) as store:
        stored = gates(store).row(0, named=True)  # the store's row: every column, its state, its alerts and more
    typed = GateRow.of(stored)
    assert (typed.calibration_id, typed.alpha, typed.threshold, typed.state) == (
        stored["calibration_id"], 0.3, stored["threshold"], stored["state"])
    assert typed.alerts == tuple(stored["alerts"] or ()) and typed["n_cal"] == stored["n_cal"]
    assert gate_of(typed) == CalibrationResult.from_json(stored["result_json"]).gate()
    assert gate_of(typed).threshold == stored["threshold"] and gate_of(typed).metadata.get("withheld") is None


def test_gate_states_hand_out_typed_rows(tmp_path: Path) -> None:
    """find, promote, retire and the live gate are GateRows whatever state they leave the gate in; a withheld
    gate says why as a field, not as an extra dict key."""
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=300)
    calibrate_store(str(db), [key], CalibrationConfig(alphas=(0.3,), bounds=("cp",), n_splits=5))
    with Store.open(db) as store:
        found = find_gate(store, gates(store).filter(state="live").get_column("calibration_id")[0])
        retired = retire(store, found.calibration_id, reason="test")
        promoted, _ = promote(store, found.calibration_id, reason="back")
        live = live_gate(store, model="m", dataset="d", estimator=found.estimator, criterion=found.criterion,
                         alpha=0.3, bound="cp", search=found.search)
    assert all(isinstance(r, GateRow) for r in (found, retired, promoted, live))
    assert (found.state, retired.state, promoted.state, live.state) == ("live", "retired", "live", "live")
    assert live.withheld is None and live.reason == "back" and live.state_at is not None
