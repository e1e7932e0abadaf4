"""The gate event log read back: each gate's state is its newest event's (`gate_events`, append-only), for gates
of every kind. Below the lifecycle, so the system gates' tables read it without importing the lifecycle."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from cic.pipeline.gates.serving_state import UNATTAINABLE

if TYPE_CHECKING:
    from cic.store import Store

HOLDS_KEY = ("live", UNATTAINABLE)  # the states that speak for a serving key (one gate each)


def current_states(store: Store) -> pl.DataFrame:
    """(calibration_id, state, reason, reason_code, alerts, alert_kinds, state_at) from each gate's newest event."""
    events = store.read("gate_events", ordered=False)
    return (events.sort("created_at", "event_id").group_by("calibration_id", maintain_order=True).last()
            .select("calibration_id", "state", "reason", "reason_code", "alerts", "alert_kinds",
                    pl.col("created_at").alias("state_at")))
