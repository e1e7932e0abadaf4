"""A stored gate as the pipeline passes it on: the `calibrations` row's columns, typed, with what a pass learned
about it (its state, its alerts). Built once from the store's row (`GateRow.of`); renderers read attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class GateRow:
    """One gate: where it sits (model, dataset, estimator, criterion; alpha, delta, bound, search), what it
    certified (threshold, its bound, counts, window) and how (result JSON, plan, groups certified together)."""

    calibration_id: str
    model: str
    dataset: str
    estimator: str
    criterion: str
    alpha: float
    delta: float
    bound: str
    search: str
    threshold: float | None
    bound_value: float | None
    n_accepted: int
    n_errors: int
    n_cal: int
    data_fingerprint: str
    result_json: str
    run_key: str
    created_at: datetime | None = None
    window_from: datetime | None = None
    window_to: datetime | None = None
    kind: str | None = None
    groups: int | None = None
    plan_json: str | None = None
    state: str | None = None          # its state when it was read (live, candidate, ...)
    alerts: tuple[str, ...] = ()      # what was said about it when it was read

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> GateRow:
        """The typed row of a stored `calibrations` row (with `state` and `alerts` where the reader added them)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        values["alerts"] = tuple(values.get("alerts") or ())
        return cls(**values)

    def __getitem__(self, column: str) -> Any:
        """The column by name, as the shared checks (`verify_gate`, `gate_of`) read a row."""
        return getattr(self, column)

    def get(self, column: str, default: Any = None) -> Any:
        return getattr(self, column, default)
