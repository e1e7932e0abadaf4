"""A gate's serving state, in the same words on every surface (`cic gate list`, the export, `cic ask`, the nightly
console, Prefect's log and artifact, MLflow's registry tags): serving · withdrawn (since, why, how to restore) ·
confirmed (serving again after a withdrawal, a person's call) · candidate · unattainable · retired.

Read from a gate's newest event (its stored state and the reason's marker: a withdrawal is a live gate whose newest
event flags it), for single and system gates alike; `ServingState.serves` is what the export serves.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cic.errors import UserError
from cic.pipeline.gates.gate_rows import ColumnReader

UNATTAINABLE = "unattainable"  # a key's gate that certifies nothing (alpha unattainable): it serves "nothing"
FLAGGED = "flagged: "      # the reason of an event that flags a gate (`flag_gates`), keeping its state
ALERTED = "alerted: "      # an alert noted on a live gate that keeps serving (`recalibration.on_alarm: flag`)
WITHOUT_GUARANTEE = "without guarantee: "  # a person made live a gate whose search certifies nothing jointly
CONFIRMED = "confirmed: "  # the reason of an event by which a person confirms a flagged live gate (`confirm`)
#: each marked move's code, stored beside its sentence (`gate_events.reason_code`): every decision reads the code,
#: never the words (the prefix only reads well on `cic gate list`)
REASON_CODES = {FLAGGED: "flagged", ALERTED: "alerted", WITHOUT_GUARANTEE: "without guarantee",
                CONFIRMED: "confirmed"}

SERVING, WITHDRAWN, CONFIRMED_STATE = "serving", "withdrawn", "confirmed"
#: every serving state, in the order tables list them; `cic gate list --state` takes these and the stored states
WORDS = (SERVING, CONFIRMED_STATE, WITHDRAWN, "candidate", UNATTAINABLE, "retired")


@dataclass(frozen=True)
class ServingState:
    """What a gate does for its key now: `word` (one of WORDS), since when, why (withdrawn: the alert that withdrew
    it; unattainable and retired: what the event says) and how to restore it (withdrawn only)."""

    word: str
    since: datetime | None = None
    why: str | None = None
    restore: str | None = None

    @property
    def serves(self) -> bool:
        """Whether the export serves this gate's threshold (serving, or confirmed after a withdrawal)."""
        return self.word in (SERVING, CONFIRMED_STATE)

    def fields(self) -> dict[str, str | None]:
        """The export's words for it: `state`, `state_since` and, when withdrawn, `restore`."""
        out = {"state": self.word, "state_since": None if self.since is None else str(self.since)}
        return out | ({"restore": self.restore} if self.restore else {})

    def line(self) -> str:
        """'withdrawn since 2026-11-27 03:00 UTC: <why>; to restore: <how>' — one line for any surface."""
        text = self.word + (f" since {self.since:%Y-%m-%d %H:%M} UTC" if self.since is not None else "")
        if self.why:
            text += f": {self.why}"
        return text + (f"; to restore: {self.restore}" if self.restore else "")


DEFAULT_STORE = "cic.duckdb"  # the store every `cic gate` command reads when --db is not given


def is_default_store(db: str | Path | None) -> bool:
    """Whether a `cic gate` command run here reads `db` without --db (None: no store to name)."""
    return db is None or Path(db).resolve() == Path(DEFAULT_STORE).resolve()


def gate_command(verb: str, gate_id: str | None, db: str | Path | None = None, *flags: str) -> str:
    """`cic gate <verb> [<id>] …` in backticks as it runs from the working directory: `--db` names the store `db`
    unless it is the default one here (or None: advice stored for any surface, which names its store itself)."""
    words = [verb, *([gate_id[:12]] if gate_id else []), *([] if is_default_store(db) else ["--db", str(db)]),
             *flags]
    return f"`cic gate {' '.join(map(shlex.quote, words))}`"


def restore_advice(gate_id: str, *, anytime: bool, ready: str | None, ready_alerts: Sequence[str] = (),
                   db: str | None = None) -> str:
    """What brings a key whose live gate was withdrawn tonight back, as the case is: the anytime rule certifies
    again on its own; a candidate that certifies (`ready`) can be promoted — with `--despite-alerts`, saying why,
    when it carries alerts (`ready_alerts`); else more labelled data — or, either way, a person's review (`cic gate
    confirm`). Each command runs as printed: `db`, when given, is the store it names."""
    confirm = f"{gate_command('confirm', gate_id, db)} after review"
    if anytime:
        return f"its anytime state restarted: a new gate goes live once it certifies again; or {confirm}"
    if ready is not None and ready_alerts:
        return (f"promote candidate {ready[:12]} once its alerts are reviewed ({'; '.join(ready_alerts)}): "
                f"{gate_command('promote', ready, db, '--despite-alerts')}, or {confirm}")
    if ready is not None:
        return f"promote candidate {ready[:12]}: {gate_command('promote', ready, db)}, or {confirm}"
    return f"no candidate of its key certifies yet (more labelled data may); or {confirm}"


def flag_of(row: ColumnReader) -> str | None:
    """Why a live gate is flagged (its newest event flagged it: a relabel, drift or a monitor alarm), else None; a
    flagged gate is not served by `cic gate export` until a newer gate is promoted or a person confirms it."""
    if row.get("state") != "live" or row.get("reason_code") != REASON_CODES[FLAGGED]:
        return None
    return (row.get("reason") or "").removeprefix(FLAGGED)


def guaranteed(row: ColumnReader) -> bool:
    """Whether the gate's search gives a high-probability guarantee (`paper` — Algorithm 1 as printed — and any
    expectation-only rule do not: their gates are report results, never live unless a person opts in)."""
    from cic.stats.searches import get_search

    if row["search"] == "anytime":  # `cic.pipeline.gates.anytime_gates`: Ville's inequality, at every night
        return True
    try:
        return get_search(row["search"]).guarantee_kind == "high-probability"
    except UserError:
        return False


def no_guarantee_refusal(row: ColumnReader) -> str | None:
    """Why a live gate must not serve because its search has no guarantee (None when it may: a guaranteed
    search, or a person's explicit opt-in, `cic gate promote --without-guarantee`, as its newest event)."""
    if guaranteed(row) or row.get("reason_code") == REASON_CODES[WITHOUT_GUARANTEE]:
        return None
    return (f"gate {row['calibration_id'][:12]} comes from search {row['search']!r}, which has no high-probability "
            "guarantee: a report result, not a gate to serve (promote a gate of a guaranteed search, or opt in with "
            f"{gate_command('promote', str(row['calibration_id']), None, '--without-guarantee')})")


def _certifies(row: ColumnReader) -> bool:
    certified = row.get("certified")  # a system gate's column; a single gate's is its threshold
    return bool(certified) if certified is not None else row.get("threshold") is not None


def serving_state(row: ColumnReader) -> ServingState:
    """The serving state of a gate row read with its newest event (`state`, `reason`, `state_at`)."""
    state, reason, since = row.get("state") or "candidate", row.get("reason") or "", row.get("state_at")
    code = row.get("reason_code")
    short = str(row.get("calibration_id"))[:12]
    if state == "live":
        flag = flag_of(row)
        if flag is not None:
            return ServingState(WITHDRAWN, since, flag, f"promote a newer gate of its key, or after review "
                                                        f"`cic gate confirm {short}`")
        refusal = no_guarantee_refusal(row)
        if refusal is not None:
            return ServingState(WITHDRAWN, since, refusal, "promote a gate of a guaranteed search")
        if not _certifies(row):
            return ServingState(UNATTAINABLE, since, reason or None)
        if code == REASON_CODES[CONFIRMED]:
            return ServingState(CONFIRMED_STATE, since, reason.removeprefix(CONFIRMED))
        return ServingState(SERVING, since, reason.removeprefix(ALERTED) if code == REASON_CODES[ALERTED] else None)
    if state == UNATTAINABLE:
        return ServingState(UNATTAINABLE, since, f"alpha = {row.get('alpha'):g} certifies nothing on its "
                                                 f"{row.get('n_cal')} labelled questions: its key serves nothing")
    return ServingState(state, since, reason or None if state == "retired" else None)

