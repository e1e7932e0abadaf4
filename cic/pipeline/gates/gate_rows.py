"""A stored gate as the pipeline passes it on: the `calibrations` row's columns, typed, with what its event log
says of it (state, reason, alerts, when) and, where serving refused it, why. Built once from the store's row
(`GateRow.of`, `gate_rows`); the gate states, the export, the registry and the renderers read attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from cic.pipeline.alerts import stored

if TYPE_CHECKING:
    import polars as pl


class ColumnReader(Protocol):
    """A row read by column name: a `GateRow`, or a system gate's stored row (the checks both share: `flag_of`,
    `guaranteed`, the registry's states)."""

    def __getitem__(self, column: str, /) -> Any: ...

    def get(self, column: str, default: Any = None, /) -> Any: ...


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
    reason: str | None = None         # its newest event's reason (who or what moved it, and why)
    state_at: datetime | None = None  # when its newest event was written
    withheld: str | None = None       # why serving refused it (`live_gate`: it serves nothing), else None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> GateRow:
        """The typed row of a stored `calibrations` row (with its event columns where the reader joined them)."""
        values = {k: v for k, v in row.items() if k in _COLUMNS}
        values["alerts"] = stored(row.get("alerts"), row.get("alert_kinds"))
        return cls(**values)

    def __getitem__(self, column: str) -> Any:
        """The column by name, as the shared checks (`verify_gate`, `gate_of`) read a row."""
        return getattr(self, column)

    def get(self, column: str, default: Any = None) -> Any:
        return getattr(self, column, default)


@dataclass(frozen=True)
class SystemGateRow:
    """One system gate (a cascade, or a model's estimator chosen): its `calibrations` row's columns, typed,
    with its event log's state, reason, alerts and when, as `GateRow` has them for a single gate."""

    calibration_id: str
    system: str
    system_kind: str
    models: list[str]
    estimators: list[str] | None
    estimator_rule: str
    costs: list[float | None] | None
    dataset: str
    criterion: str
    alpha: float
    delta: float
    bound: str
    search: str
    thresholds: list[float | None]
    certified: bool
    bound_value: float | None
    n_accepted: int
    n_errors: int
    n_cal: int
    shares: list[float] | None
    cost_per_question: float | None
    candidates: int
    run_keys: list[str]
    question_ids: list[str]
    data_fingerprint: str
    guarantee: str
    created_at: datetime | None = None
    state: str | None = None
    alerts: tuple[str, ...] = ()
    reason: str | None = None
    state_at: datetime | None = None
    withheld: str | None = None  # why serving refused it (`live_gate`: it serves nothing), else None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> SystemGateRow:
        """The typed row of a stored system gate's row (with its event columns where joined)."""
        values = {k: v for k, v in row.items() if k in _SYSTEM_COLUMNS}
        values["alerts"] = stored(row.get("alerts"), row.get("alert_kinds"))
        return cls(**values)

    def columns(self) -> dict[str, Any]:
        """Its columns by name (a shallow copy: what a table of gates reads)."""
        return {name: getattr(self, name) for name in _SYSTEM_COLUMNS}

    def __getitem__(self, column: str) -> Any:
        return getattr(self, column)

    def get(self, column: str, default: Any = None) -> Any:
        return getattr(self, column, default)


_COLUMNS = frozenset(f.name for f in fields(GateRow))
_SYSTEM_COLUMNS = tuple(f.name for f in fields(SystemGateRow) if f.name != "withheld")


def gate_rows(frame: pl.DataFrame) -> list[GateRow]:
    """Each row of a gates table (`cic.pipeline.gates.lifecycle.gates`), typed."""
    return [GateRow.of(row) for row in frame.iter_rows(named=True)]


def system_gate_rows(frame: pl.DataFrame) -> list[SystemGateRow]:
    """Each row of a system gates table (`cic.pipeline.gates.system_gates.system_gates`), typed."""
    return [SystemGateRow.of(row) for row in frame.iter_rows(named=True)]
