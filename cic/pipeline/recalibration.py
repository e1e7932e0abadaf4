"""Scheduled recalibration: recalibrate each group on the newest labelled window and compare with the last gate.

The window is the `window` most recently labelled questions of a run (labels' `created_at`), or all of
them. For every (alpha, bound, search) the new gate is compared with the previous calibration of the same
key (`cic.stats.drift.compare_calibrations`): threshold change, coverage change on the new window, and a
two-sample KS test between the previous window's scores and the new ones (an exchangeability warning).
An alpha that has become unattainable is flagged loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from cic.pipeline.stored_calibration import GroupKey, calibration_rows
from cic.stats.drift import DriftReport, compare_calibrations

if TYPE_CHECKING:
    from cic.pipeline.config import CalibrationConfig
    from cic.store import Store


@dataclass(frozen=True)
class Recalibration:
    """One new gate with its comparison to the previous gate of the same key (None on the first run)."""

    key: GroupKey
    row: dict[str, Any]
    previous: dict[str, Any] | None
    drift: DriftReport | None

    @property
    def alerts(self) -> list[str]:
        if self.drift is not None:
            return self.drift.warnings()
        return ["alpha is unattainable on this window: the gate abstains on everything"] \
            if self.row["threshold"] is None else []


def labelled_pairs(store: Store, key: GroupKey) -> pl.DataFrame:
    """(question_id, score, error, labelled_at) of a group, newest label last."""
    rows = store.sql(
        "SELECT s.question_id, s.value, NOT l.aligned, l.created_at FROM scores s JOIN labels l "
        "ON s.run_key = l.run_key AND s.question_id = l.question_id "
        "WHERE s.run_key = ? AND s.estimator = ? AND l.criterion = ? AND s.value IS NOT NULL "
        "ORDER BY l.created_at, s.question_id", [key.run_key, key.estimator, key.criterion])
    return pl.DataFrame(rows, schema={"question_id": pl.String, "score": pl.Float64, "error": pl.Int8,
                                      "labelled_at": pl.Datetime("us", "UTC")}, orient="row")


def newest_window(pairs: pl.DataFrame, window: int | None) -> pl.DataFrame:
    """The `window` most recently labelled pairs (all when None)."""
    return pairs if window is None or pairs.height <= window else pairs.tail(window)


def previous_gate(store: Store, key: GroupKey, row: dict[str, Any]) -> dict[str, Any] | None:
    """The newest stored calibration of the same key on other data, if any."""
    found = store.read("calibrations", run_key=key.run_key, estimator=key.estimator, criterion=key.criterion,
                       alpha=row["alpha"], delta=row["delta"], bound=row["bound"], search=row["search"])
    found = found.filter(pl.col("data_fingerprint") != row["data_fingerprint"]).sort("created_at")
    return found.row(-1, named=True) if found.height else None


def window_of(pairs: pl.DataFrame, gate: dict[str, Any]) -> pl.DataFrame:
    """The pairs a stored gate was calibrated on (by its label-time window; before it was made, if unset)."""
    start: datetime | None = gate.get("window_from")
    end: datetime | None = gate.get("window_to") or gate.get("created_at")
    chosen = pairs
    if start is not None:
        chosen = chosen.filter(pl.col("labelled_at") >= start)
    if end is not None:
        chosen = chosen.filter(pl.col("labelled_at") <= end)
    return chosen


def recalibrate_group(store: Store, key: GroupKey, config: CalibrationConfig, *, window: int | None,
                      shift_p_value: float) -> tuple[pl.DataFrame, list[Recalibration]]:
    """New gates on the newest window (rows for `calibrations`) and their comparisons with the previous gates."""
    pairs = labelled_pairs(store, key)
    recent = newest_window(pairs, window)
    if recent.height < 2:
        raise ValueError(f"{key.model}/{key.dataset} {key.estimator} × {key.criterion}: only {recent.height} "
                         "labelled question(s); recalibration needs at least 2")
    span = (recent.get_column("labelled_at").min(), recent.get_column("labelled_at").max())
    rows = calibration_rows(key, recent.select("question_id", "score", "error"), config, kind="recalibration",
                            window=span)
    out = []
    for row in rows.iter_rows(named=True):
        previous = previous_gate(store, key, row)
        drift = None
        if previous is not None:
            before = window_of(pairs, previous).get_column("score").to_numpy()
            if before.size:
                drift = compare_calibrations(before, recent.get_column("score").to_numpy(),
                                             previous_threshold=previous["threshold"], threshold=row["threshold"],
                                             shift_p_value=shift_p_value)
        out.append(Recalibration(key, row, previous, drift))
    return rows, out
