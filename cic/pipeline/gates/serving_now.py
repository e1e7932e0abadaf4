"""What serves now, per serving key, after a nightly pass: the table at the top of the Prefect artifact and the last
lines of the log and the console — each key (single gates by model, dataset, estimator, criterion, alpha, bound and
search; system gates by name) with its serving state (`cic.pipeline.gates.serving_state`), its threshold(s) or why it
serves nothing, and what changed tonight. Read from the gate event log (no re-certification: `cic gate export`
does that before serving)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from cic.pipeline.gates.gate_rows import gate_rows
from cic.pipeline.gates.serving_state import serving_state
from cic.pipeline.run.missing_labels import ASSUMPTIONS, WORST_CASE, gate_assumption
from cic.pipeline.run.run_results import stage_thresholds

if TYPE_CHECKING:
    from cic.store import Store


@dataclass(frozen=True)
class ServingRow:
    """One serving key after the pass."""

    key: str                 # "m/d se × crit α=0.2 cp fallback", or "cascade NAME/d × crit α=0.2 cp fallback"
    state: str               # the serving word: serving, confirmed, withdrawn, unattainable, retired
    gate_id: str | None
    threshold: str           # "0.4321", every stage's ("0.1 / 0.5"), or "—" when it serves nothing
    changed: str = ""        # "promoted tonight", "withdrawn tonight", or ""
    why: str = ""            # why it serves nothing (withdrawn: and how to restore it)
    system: bool = False     # a system gate (a cascade, an estimator chosen)
    labels: str = ""         # the label assumption its certificate rests on (`missing_labels.gate_assumption`)

    @property
    def serves(self) -> bool:
        return self.state in ("serving", "confirmed")

    def line(self) -> str:
        text = f"{self.key}: {self.state}"
        if self.gate_id:
            text += f" gate {self.gate_id[:12]}"
        if self.serves:
            text += f" at {self.threshold}"
        if self.changed:
            text += f" ({self.changed})"
        if self.serves and self.labels and self.labels != ASSUMPTIONS[WORST_CASE]:
            text += f"; {self.labels}"
        return text + (f" — {self.why}" if self.why and not self.serves else "")


def serving_now(store: Store, models: Collection[str], promoted: Sequence[str] = (),
                withdrawn: Collection[str] = ()) -> list[ServingRow]:
    """Per serving key of these models that has a gate speaking for it (live or unattainable) or had one (all
    retired): what it serves now, single keys first, serving keys before those serving nothing."""
    from cic.pipeline.gates.lifecycle import SERVING_KEY, gates
    from cic.pipeline.gates.system_gates import SYSTEM_KEY, system_gates

    changed = {**{g: "promoted tonight" for g in promoted}, **{g: "withdrawn tonight" for g in withdrawn}}
    rows = []
    single = gates(store).filter(pl.col("model").is_in(list(models)))
    for part in single.sort(*SERVING_KEY, "state_at").partition_by(list(SERVING_KEY), maintain_order=True):
        row = _speaker(gate_rows(part))
        if row is not None:
            key = (f"{row.model}/{row.dataset} {row.estimator} × {row.criterion} α={row.alpha:g} {row.bound} "
                   f"{row.search}")
            rows.append(_row(key, row, "—" if row.threshold is None else f"{row.threshold:.4g}", changed))
    systems = system_gates(store).filter(pl.col("models").list.eval(pl.element().is_in(list(models))).list.any())
    for part in systems.sort(*SYSTEM_KEY, "state_at").partition_by(list(SYSTEM_KEY), maintain_order=True):
        row = _speaker(gate_rows(part))
        if row is not None:
            key = (f"{row.system_kind} {row.system}/{row.dataset} × {row.criterion} α={row.alpha:g} {row.bound} "
                   f"{row.search}")
            rows.append(_row(key, row, stage_thresholds(row.thresholds) if row.certified else "—", changed,
                             system=True))
    return sorted(rows, key=lambda r: (r.system, not r.serves, r.key))


def _speaker(rows: Sequence[Any]) -> Any:
    """The gate speaking for a key (its newest live or unattainable one), else its newest retired one, else None."""
    for states in (("live", "unattainable"), ("retired",)):
        chosen = [r for r in rows if r.state in states]
        if chosen:
            return chosen[-1]
    return None


def _row(key: str, row: Any, threshold: str, changed: dict[str, str], *, system: bool = False) -> ServingRow:
    state = serving_state(row)
    why = ""
    if not state.serves:
        why = state.why or ""
        if state.restore:
            why += f"; to restore: {state.restore}"
    return ServingRow(key, state.word, row.calibration_id, threshold, changed.get(row.calibration_id, ""), why, system,
                      gate_assumption(row))


def live_gate_ids(store: Store, run_keys: Sequence[str]) -> list[str]:
    """The live gates (single, and system gates all of whose stages are among these runs) of these runs."""
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.gates.system_gates import system_gates

    single = gates(store).filter(pl.col("run_key").is_in(list(run_keys)) & (pl.col("state") == "live"))
    systems = system_gates(store).filter((pl.col("state") == "live") & pl.col("run_keys").list.eval(
        pl.element().is_in(list(run_keys))).list.all())
    return [*single.get_column("calibration_id").to_list(), *systems.get_column("calibration_id").to_list()]


def markdown_table(rows: Sequence[ServingRow], shown: int = 500) -> list[str]:
    """The serving-now table for the Prefect artifact (at most `shown` keys; `cic gate list` has them all)."""
    lines = ["## Serving now", "", f"{sum(r.serves for r in rows)} of {len(rows)} key(s) serve a gate.", "",
             "| key | serving | gate | threshold | labels | tonight | why nothing is served |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.key} | {r.state} | {(r.gate_id or '—')[:12]} | {r.threshold if r.serves else '—'} | "
              f"{r.labels or '—'} | {r.changed or '—'} | {r.why.replace('|', '/') or '—'} |" for r in rows[:shown]]
    if len(rows) > shown:
        lines.append(f"\n{len(rows) - shown} more key(s): `cic gate list --state live`")
    return lines
