"""The anytime-valid monitor of every live gate, updated by each recalibration pass and kept in DuckDB
(`gate_monitor`): per live gate, the answered questions and errors among the labelled pairs seen after its window
(each pair counted once, whenever its label arrives: the counts are over the set of such pairs, so a late label
counts on the next pass), the e-value against "error rate among answered ≤ α", and the rate's anytime-valid lower
confidence bound (`cic.stats.monitoring`).

The family: all G live gates with a threshold that a pass monitors; a gate alarms when its e-value reaches
G / level (Bonferroni over e-values, valid under any dependence between gates), and stays alarmed until it is
replaced. While a gate's rate stays ≤ α, the chance that it ever alarms is ≤ level / G, however many nights run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.pipeline.alerts import MONITOR_ALARM, Alert
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow
from cic.stats.monitoring import e_value, lower_bound
from cic.store.queries import newest_monitor_rows

if TYPE_CHECKING:
    from cic.pipeline.run.stored_calibration import GroupKey
    from cic.store import Store


@dataclass
class MonitorUpdate:
    """One live gate's monitor after this pass (its previous state when no new labelled pair arrived)."""

    key: GroupKey
    gate: ColumnReader
    row: dict[str, Any]
    new_pairs: int
    changed: bool = True  # (n, k) moved since the last stored row: a new row is stored

    def alert(self) -> Alert:
        """The alarm: the gate, the evidence, the rate's bound, the nights since it went live."""
        r, g = self.row, self.gate
        since = g.get("state_at") or g["created_at"]
        nights = max((r["checked_at"] - since).days, 0) if since is not None else r["nights"]
        return Alert(MONITOR_ALARM, (
            f"anytime-valid monitor of live gate {g['calibration_id'][:12]} ({self.key.model} · dataset "
            f"{self.key.dataset} · {self.key.estimator}, α={g['alpha']:g}): error rate among answered questions "
            f"above α — e-value {r['e_value']:.3g} ≥ {r['alarm_at']:g}, rate ≥ {r['rate_lower_bound']:.3f} "
            f"({r['k']} errors in {r['n']} answered, {r['nights']} check(s)), {nights} night(s) since it went live"))


def previous_states(store: Store) -> dict[str, dict[str, Any]]:
    """The newest monitor row of each gate."""
    return {r["calibration_id"]: r for r in newest_monitor_rows(store).iter_rows(named=True)}


def monitor_group(key: GroupKey, pairs: pl.DataFrame, live_rows: list[GateRow],
                  previous: dict[str, dict[str, Any]], now: datetime) -> list[MonitorUpdate]:
    """Each live gate of a group (with a threshold): its counts over every labelled pair seen after its window,
    whenever the label arrived. Counted as a set, not since a time mark: a label that arrives late for a record
    seen before the last pass's newest pair still counts, and a pass with nothing new counts nothing twice
    (the e-value depends on (n, k) alone, so recounting the set is the same as adding each pair once).
    The e-value and alarm are set by `finish` once the family is known."""
    out = []
    for gate in live_rows:
        if gate["threshold"] is None:
            continue
        after = gate["window_to"] or gate["created_at"]
        seen = pairs.filter(pl.col("at") > after) if after is not None else pairs
        answered = seen.filter(pl.col("score") <= gate["threshold"])
        newest = seen.get_column("at").max() if seen.height else after
        out.append(update_of(key, gate, answered.height, int(answered.get_column("error").sum() or 0), newest,
                             previous, now))
    return out


def update_of(key: GroupKey, gate: ColumnReader, n: int, k: int, newest: datetime | None,
              previous: dict[str, dict[str, Any]], now: datetime) -> MonitorUpdate:
    """A gate's monitor after counting n answered and k errors among every labelled pair seen after its data
    (a single gate's window, a system gate's certified questions); `newest`: the newest such pair's time."""
    before = previous.get(gate["calibration_id"])
    old_n, old_k = (before["n"], before["k"]) if before else (0, 0)
    changed = (n, k) != (old_n, old_k)
    return MonitorUpdate(key, gate, {
        "calibration_id": gate["calibration_id"], "checked_at": now,
        "seen_to": newest if changed or not before else before["seen_to"],
        "nights": (before["nights"] if before else 0) + (1 if changed else 0), "n": n, "k": k,
        "e_value": None, "alarm_at": None, "rate_lower_bound": before["rate_lower_bound"] if before else 0.0,
        "alarmed": bool(before["alarmed"]) if before else False, "created_at": now},
        max(n - old_n, 0), changed)


def finish(updates: list[MonitorUpdate], level: float) -> list[MonitorUpdate]:
    """E-values, bounds and alarms for the family of gates monitored in this pass (alarm at G / level)."""
    family = max(len(updates), 1)
    for update in updates:
        row, alpha = update.row, float(update.gate["alpha"])
        row["e_value"] = e_value(row["n"], row["k"], alpha)
        row["alarm_at"] = family / level
        row["rate_lower_bound"] = max(row["rate_lower_bound"], lower_bound(row["n"], row["k"], level / family))
        row["alarmed"] = row["alarmed"] or row["e_value"] >= row["alarm_at"]
    return updates


def store_updates(store: Store, updates: list[MonitorUpdate]) -> None:
    """One `gate_monitor` row per gate whose counts moved this pass (new labels, late ones included)."""
    rows = [u.row for u in updates if u.changed]
    if rows:
        store.upsert("gate_monitor", pl.DataFrame(rows, schema=schema.GATE_MONITOR.schema))
