"""A stored gate (single or system) as the pipeline passes it on: the `calibrations` row's columns, typed, with
what its event log says of it (state, reason, alerts, when) and, where serving refused it, why. Built once from
the store's row (`GateRow.of`, `gate_rows`); the gate states, the export, the registry and the renderers read
attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from cic import schema
from cic.pipeline.alerts import stored

if TYPE_CHECKING:
    import polars as pl


class ColumnReader(Protocol):
    """A row read by column name: a `GateRow`, or a gate's stored row as a dict (the checks both share: `flag_of`,
    `guaranteed`, the registry's states)."""

    def __getitem__(self, column: str, /) -> Any: ...

    def get(self, column: str, default: Any = None, /) -> Any: ...


@dataclass(frozen=True)
class GateRow:
    """One gate — single or system — as its `calibrations` row's columns, typed. Where it sits (dataset,
    criterion; alpha, delta, bound, search) and what it certified (its bound, counts) every gate has; a single gate
    also its model, estimator, threshold, run, window and how (result JSON, plan, groups certified together); a
    system gate (a cascade, or a model's estimator chosen: `system` set) its stages instead — models, estimators,
    thresholds, runs, shares — the questions it was certified on and its guarantee in words. The cascade is a
    property of the gate (a single gate is the system of one stage), not another type."""

    calibration_id: str
    dataset: str
    criterion: str
    alpha: float
    delta: float
    bound: str
    search: str
    bound_value: float | None
    n_accepted: int
    n_errors: int
    n_cal: int
    data_fingerprint: str
    # a single gate
    model: str | None = None
    estimator: str | None = None
    threshold: float | None = None
    result_json: str | None = None
    run_key: str | None = None
    window_from: datetime | None = None
    window_to: datetime | None = None
    kind: str | None = None
    groups: int | None = None
    plan_json: str | None = None
    # a system gate
    system: str | None = None
    system_kind: str | None = None    # cascade | estimator
    models: list[str] | None = None
    estimators: list[str] | None = None
    estimator_rule: str | None = None
    costs: list[float | None] | None = None
    thresholds: list[float | None] | None = None
    certified: bool | None = None
    shares: list[float] | None = None
    cost_per_question: float | None = None
    candidates: int | None = None
    run_keys: list[str] | None = None
    question_ids: list[str] | None = None
    guarantee: str | None = None
    created_at: datetime | None = None
    favour: str | None = None         # a cascade's favoured model ("scores": the lowest median score), None: none
    prior: str | None = None          # an estimator choice's prior from other data (JSON), None: delta / K each
    # what its event log says of it when it was read
    state: str | None = None          # its state (live, candidate, ...)
    alerts: tuple[str, ...] = ()      # what was said about it
    reason: str | None = None         # its newest event's reason (who or what moved it, and why)
    reason_code: str | None = None    # what that move means (`serving_state.REASON_CODES`): what decisions read
    state_at: datetime | None = None  # when its newest event was written
    withheld: str | None = None       # why serving refused it (`live_gate`: it serves nothing), else None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> GateRow:
        """The typed row of a stored gate's row (with its event columns where the reader joined them)."""
        values = {k: v for k, v in row.items() if k in _COLUMNS}
        values["alerts"] = stored(row.get("alerts"), row.get("alert_kinds"))
        return cls(**values)

    @property
    def is_system(self) -> bool:
        """Whether it is a system gate (a cascade, an estimator chosen) rather than a single model's."""
        return self.system is not None

    def columns(self) -> dict[str, Any]:
        """Its stored columns by name (`schema.SYSTEM_GATE_COLUMNS` or `SINGLE_GATE_COLUMNS`; a shallow copy)."""
        names = schema.SYSTEM_GATE_COLUMNS if self.is_system else schema.SINGLE_GATE_COLUMNS
        return {name: getattr(self, name) for name in names}

    def __getitem__(self, column: str) -> Any:
        """The column by name, as the shared checks (`verify_gate`, `gate_of`, `flag_of`) read a row."""
        return getattr(self, column)

    def get(self, column: str, default: Any = None) -> Any:
        return getattr(self, column, default)


_COLUMNS = frozenset(f.name for f in fields(GateRow))


def gate_rows(frame: pl.DataFrame) -> list[GateRow]:
    """Each row of a table of gates (`cic.pipeline.gates.lifecycle.gates`, `system_gates.system_gates`), typed."""
    return [GateRow.of(row) for row in frame.iter_rows(named=True)]
