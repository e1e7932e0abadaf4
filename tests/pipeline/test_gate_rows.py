"""A stored gate typed once from its row: columns as attributes, the pass's state and alerts, the same gate."""

from __future__ import annotations

from pathlib import Path

from cic.pipeline.calibrate_store import calibrate_store
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gate_rows import GateRow
from cic.pipeline.gates import gate_of, gates
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
    assert gate_of(typed) == gate_of(stored) and gate_of(typed).threshold == stored["threshold"]
