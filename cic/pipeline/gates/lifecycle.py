"""Gate states: a stored calibration is a *candidate* until promoted *live*; promoting retires the live gate of
the same serving key. Only a live gate is served (`cic ask`, `cic gate export`, the MLflow alias `live`). A gate
that certifies nothing (alpha unattainable) is never live: where it speaks for its key it is *unattainable* and
the key serves nothing, saying why.

States are an append-only log (`gate_events`): a gate's state is its newest event's, a gate without events is a
candidate, and every move says who or what made it. The serving key is (model, dataset, estimator, criterion,
alpha, delta, bound, search): one live gate each. The first gate of a key the pipeline computes goes live (so
`cic run` → `cic ask` works); every later gate, and every recalibration, waits as a candidate for promotion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.alerts import OVER_BUDGET, Alert, kind_names, stored
from cic.pipeline.gates.certificates import recertify_all
from cic.pipeline.gates.event_log import HOLDS_KEY, current_states
from cic.pipeline.gates.gate_rows import GateRow, gate_rows
from cic.pipeline.gates.serving_state import (
    CONFIRMED,
    FLAGGED,
    REASON_CODES,
    UNATTAINABLE,
    WITHOUT_GUARANTEE,
    flag_of,
    guaranteed,
    no_guarantee_refusal,
)
from cic.pipeline.gates.system_gates import SYSTEM_KEY, recertify_system, system_gates, system_key
from cic.store.queries import last_gate_events, made_before_rules, stored_gate_ids

if TYPE_CHECKING:
    from cic.stats.gate import Gate
    from cic.store import Store

STATES = ("candidate", "live", "retired", UNATTAINABLE)
SERVING_KEY = ("model", "dataset", "estimator", "criterion", "alpha", "delta", "bound", "search")
# a grouped certificate speaks for a model's live gates of one configuration across its datasets (streams)
FAMILY_KEY = tuple(k for k in SERVING_KEY if k != "dataset")
Families = dict[tuple[Any, ...], list[GateRow]]  # live gates by family key (`live_families`)


def gates(store: Store, **equals: Any) -> pl.DataFrame:
    """Stored single gates (filtered by column equality), in their columns (`schema.SINGLE_GATE_COLUMNS`), with
    their state; no event = candidate."""
    rows = store.read("calibrations", system=None, **equals).select(schema.SINGLE_GATE_COLUMNS)
    joined = rows.join(current_states(store), on="calibration_id", how="left")
    return joined.with_columns(pl.col("state").fill_null("candidate"),
                               pl.col("alerts").fill_null(pl.lit([], dtype=pl.List(pl.String))),
                               pl.col("alert_kinds").fill_null(pl.lit([], dtype=pl.List(pl.String))))


def find_gate(store: Store, gate_id: str) -> GateRow:
    """The gate — single or system (a cascade, an estimator chosen) — whose calibration id is or starts with
    `gate_id` (the 12-character prefix tables show)."""
    text = gate_id.strip()
    if len(text) < 6:
        raise UserError(f"gate id = {gate_id!r}: give at least 6 characters of it (`cic gate list` shows them)")
    found = [row for kind in KINDS for row in kind.typed(kind.table(store).filter(
        pl.col("calibration_id").str.starts_with(text)))]
    if not found:
        raise UserError(f"gate id = {gate_id!r}: no stored gate has it in {store.path} (`cic gate list` shows them)")
    if len(found) > 1:
        raise UserError(f"gate id = {gate_id!r}: {len(found)} gates start with it; give more characters")
    return found[0]


@dataclass(frozen=True)
class GateKind:
    """What a lifecycle move needs to know of a gate's kind — single, or system (a cascade, an estimator chosen; a
    single gate is the system of one stage), both `GateRow`s of `calibrations`: its stored rows with their state;
    the key one gate speaks for; whether it certifies anything; and its re-check against the store (`verify`).
    Find, promote, confirm, retire and the first gates are written once over it."""

    noun: str
    table: Callable[[Store], pl.DataFrame]
    typed: Callable[[pl.DataFrame], list[Any]]
    key_columns: tuple[str, ...]
    key: Callable[[Any], tuple[Any, ...]]
    certifies: Callable[[Any], bool]
    verify_many: Callable[[Store, Sequence[Any]], None]


def _verify_singles(store: Store, rows: Sequence[GateRow]) -> None:
    """Each row against its own result, then the certificates of those that certify something, recomputed from
    the store's pairs in one read."""
    for row in rows:
        verify_gate(row)
    recertify_all(store, [row for row in rows if row["threshold"] is not None])


def _verify_systems(store: Store, rows: Sequence[GateRow]) -> None:
    for row in rows:
        recertify_system(store, row)


def kind_of(row: GateRow) -> GateKind:
    """The kind of a typed gate row."""
    return KINDS[1 if row.is_system else 0]


def verify(store: Store, row: GateRow) -> None:
    """Refuse to serve a gate the store no longer certifies (either kind): the one check promotion, confirmation,
    export, `cic ask` and the registry share. A gate made before the store took today's rules that does not
    re-certify is said to be certified by an earlier version (not edited), with the way to re-certify it."""
    try:
        kind_of(row).verify_many(store, [row])
    except UserError as exc:
        if row["calibration_id"] not in made_before_rules(store, [row["calibration_id"]]):
            raise
        raise UserError(f"{kind_of(row).noun} {row['calibration_id'][:12]} was certified by an earlier version of "
                        "cic and does not re-certify under today's rules; `cic run` or `cic recalibrate` "
                        f"re-certifies it (the re-check said: {str(exc).split(': ', 1)[-1]})") from None


def recertified(store: Store, rows: Sequence[GateRow]) -> tuple[list[GateRow], dict[str, str]]:
    """The rows with every serving one that fails re-certification marked flagged in memory (it serves nothing;
    the store is not written), and id -> why for those: one gate that cannot be re-certified withdraws its own
    key, never the others'. Every serving gate of a kind is re-certified at once (the pairs of all their runs read
    in one query, the common case); when that fails, each is checked alone to name it."""
    from cic.pipeline.gates.serving_state import serving_state

    serving = [row for row in rows if serving_state(row).serves]
    try:
        for kind in KINDS:
            kind.verify_many(store, [row for row in serving if kind_of(row) is kind])
        return list(rows), {}
    except UserError:
        pass
    out, why = [], {}
    for row in rows:
        if serving_state(row).serves:
            try:
                verify(store, row)
            except UserError as exc:
                why[row["calibration_id"]] = str(exc)
                row = replace(row, reason=f"{FLAGGED}not re-certified: {exc}", reason_code=REASON_CODES[FLAGGED])
        out.append(row)
    return out, why


def _events(store: Store, moves: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Event rows for (calibration id, state, reason, alerts[, reason code[, caused at]]) moves, each timed strictly
    after its gate's previous event; one query for all of them."""
    for _, state, *_ in moves:
        if state not in STATES:
            raise ValueError(f"state = {state!r}: one of {', '.join(STATES)}")
    if not moves:
        return []
    last = last_gate_events(store, [m[0] for m in moves])
    now = datetime.now(UTC)
    out = []
    for calibration_id, state, reason, alerts, *marks in moves:
        code, caused_at = (*marks, None, None)[:2]
        at = now
        previous = last.get(calibration_id)
        if previous is not None and at <= previous:
            at = previous + timedelta(microseconds=1)
        last[calibration_id] = at  # two moves of one gate in a batch stay ordered
        out.append({"event_id": schema.value_hash(calibration_id, state, at.isoformat(), reason),
                    "calibration_id": calibration_id, "state": state, "reason": reason, "alerts": list(alerts),
                    "created_at": at, "alert_kinds": kind_names(alerts), "reason_code": code,
                    "caused_at": caused_at})
    return out


def _write(store: Store, events: list[dict[str, Any]]) -> None:
    if events:
        store.upsert("gate_events", pl.DataFrame(events, schema=schema.GATE_EVENTS.schema))


def write_moves(store: Store, moves: Sequence[tuple[Any, ...]]) -> None:
    """Append (calibration id, state, reason, alerts[, reason code]) moves to the gate event log (system gates use
    it too)."""
    _write(store, _events(store, moves))


def record_candidates(store: Store, alerts_by_gate: dict[str, Sequence[str]], reason: str) -> None:
    """Mark new gates as candidates with what their recalibration found (a gate with a state keeps it)."""
    known = set(current_states(store).get_column("calibration_id").to_list())
    _write(store, _events(store, [(gid, "candidate", reason, alerts) for gid, alerts in alerts_by_gate.items()
                                  if gid not in known]))


def gate_of(row: GateRow) -> Gate:
    """The gate a stored calibration row certifies (its result's threshold and metadata), or, for a row that
    `live_gate` withheld, a gate that accepts nothing: the one conversion from a stored row to a `Gate`, for
    `cic ask`, the served export, the MLflow layout and the registry alike."""
    from cic.stats.calibration import CalibrationResult
    from cic.stats.gate import Gate

    if row.withheld is not None:
        return Gate(None, {"withheld": row.withheld, "calibration_id": row.calibration_id})
    return CalibrationResult.from_json(row.result_json).gate()


def verify_gate(row: GateRow) -> None:
    """Refuse a stored gate that disagrees with its own stored result, or whose certificate does not hold:
    the threshold, alpha, delta (delta / groups for a gate certified with its model's other datasets), bound and
    search columns must equal the result JSON's, and a threshold needs (n_errors, n_accepted) whose upper bound at
    the result's level is <= alpha (for `lec`, its own condition on the counts)."""
    from cic.stats.calibration import CalibrationResult
    from cic.stats.searches import DEFAULT_SEARCH, SEARCHES

    name = f"stored gate {str(row.get('calibration_id'))[:12]}"
    try:
        result = CalibrationResult.from_json(row["result_json"])
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{name}: its stored result does not parse ({exc}); refusing to serve it") from None
    together = row.get("groups") or 1  # one of G gates certified at once: its result is at delta / G
    if not (isinstance(together, int) and together >= 1):
        raise UserError(f"{name}: column groups = {together!r} is not a positive count; refusing to serve it")
    for column in ("threshold", "alpha", "delta", "bound", "search", "n_accepted", "n_errors"):
        stored, certified = row.get(column), getattr(result, column)
        if column == "delta" and isinstance(certified, float):
            certified *= together
        same = stored == certified or (isinstance(stored, float) and isinstance(certified, float)
                                       and math.isclose(stored, certified, rel_tol=1e-12))
        if not same:
            raise UserError(f"{name}: column {column} = {stored!r} but its certified result says {certified!r}; "
                             "the row was altered — refusing to serve it (recalibrate to replace it)")
    if result.threshold is not None and result.search != "anytime":  # an anytime gate: its replay is the check
        plan = SEARCHES.find(result.search) or SEARCHES[DEFAULT_SEARCH]  # a caller's own procedure: its UCB
        holds, figure = plan.certificate(result.bound, result.n_errors, result.n_accepted, result.alpha, result.gamma)
        if not holds:
            raise UserError(f"{name}: its certificate does not hold ({figure}); refusing to serve it")


def promote(store: Store, gate_id: str, *, reason: str, despite_alerts: bool = False,
            without_guarantee: bool = False) -> tuple[GateRow, list[str]]:
    """Make a gate (single or system) speak for its key and retire the gate that did, in one transaction; returns
    (the gate, the ids retired). A gate the store no longer certifies is refused; one whose recalibration raised
    alerts needs `despite_alerts` (a person who has looked at them); one from a search without a guarantee needs
    `without_guarantee`, recorded in its event's reason. One that certifies nothing becomes its key's
    *unattainable* gate: the key serves nothing."""
    row = find_gate(store, gate_id)
    kind = kind_of(row)
    short = row["calibration_id"][:12]
    code = None
    if not guaranteed(row):
        if not without_guarantee:
            raise UserError(f"gate id = {gate_id!r}: {no_guarantee_refusal(replace(row, reason_code=None))}")
        reason, code = f"{WITHOUT_GUARANTEE}{reason}", REASON_CODES[WITHOUT_GUARANTEE]
    if row["alerts"] and not despite_alerts:
        raise UserError(f"{kind.noun} {short} was written with alerts ({'; '.join(row['alerts'])}); promote it only "
                        "after review, with --despite-alerts")
    if row["state"] == "live" and flag_of(row) is not None:
        raise UserError(f"gate id = {gate_id!r}: {kind.noun} {short} is live and flagged ({flag_of(row)}); after "
                        f"review confirm it with `cic gate confirm {short}`, or promote a newer gate of its key")
    verify(store, row)
    if row["state"] == "live" and (code is None or row.get("reason_code") == code):
        return row, []  # already live (a live gate opted in without a guarantee now gets that event)
    holding = kind.typed(kind.table(store).filter(pl.col("state").is_in(HOLDS_KEY)))
    retired = [r.calibration_id for r in holding
               if kind.key(r) == kind.key(row) and r.calibration_id != row.calibration_id]
    state = "live" if kind.certifies(row) else UNATTAINABLE
    with store.transaction():
        write_moves(store, [*((gid, "retired", f"replaced by {short}", []) for gid in retired),
                            (row["calibration_id"], state, reason, list(row["alerts"] or []), code)])
    return replace(row, state=state), retired


def confirm(store: Store, gate_id: str, *, reason: str) -> GateRow:
    """Record (append-only, in `gate_events`) that a person reviewed a flagged live gate (single or system) and
    keeps serving it; its alerts stay listed. Anything but a flagged live gate is refused (there is nothing to
    confirm), and so is a gate the store's pairs no longer certify (its labels were changed: recalibrate
    instead)."""
    row = find_gate(store, gate_id)
    kind = kind_of(row)
    short = row["calibration_id"][:12]
    if row["state"] != "live":
        raise UserError(f"gate id = {gate_id!r}: {kind.noun} {short} is {row['state']}, not live; only a flagged "
                        "live gate is confirmed (`cic gate promote` puts a gate live)")
    flag = flag_of(row)
    if flag is None:
        raise UserError(f"gate id = {gate_id!r}: {kind.noun} {short} is live and not flagged; nothing to confirm")
    if not reason.strip():
        raise UserError(f"reason = {reason!r}: say who confirms it and why")
    try:  # a confirmed gate serves its certificate: it must still be the one the store's pairs give
        verify(store, row)
    except UserError as exc:
        raise UserError(f"gate id = {gate_id!r}: cannot confirm it: {exc}") from None
    write_moves(store, [(row["calibration_id"], "live", f"{CONFIRMED}{reason} (was flagged: {flag})",
                         list(row["alerts"] or []), REASON_CODES[CONFIRMED])])
    return replace(row, reason=f"{CONFIRMED}{reason}", reason_code=REASON_CODES[CONFIRMED])


def retire(store: Store, gate_id: str, *, reason: str) -> GateRow:
    """Take a gate (single or system) out of service (its key then has no live gate: `cic ask` refuses until one
    is promoted)."""
    row = find_gate(store, gate_id)
    if row["state"] != "retired":
        write_moves(store, [(row["calibration_id"], "retired", reason, list(row["alerts"] or []))])
    return replace(row, state="retired")


def promote_many(store: Store, gate_ids: Sequence[str], *, reason: str) -> list[str]:
    """Make these gates — single or system — speak for their keys (one per key: the last given wins) and retire the
    gates that did, in one transaction and one read per kind; alerting, unguaranteed or unverifiable gates are
    refused (nothing is written then). One that certifies nothing becomes its key's *unattainable* gate. Returns
    the ids made live."""
    if not gate_ids:
        return []
    moves: list[tuple[str, str, str, Sequence[str]]] = []
    promoted, found = [], set()
    for kind in KINDS:
        table = kind.table(store)
        chosen = {row.calibration_id: row for row in kind.typed(
            table.filter(pl.col("calibration_id").is_in(list(gate_ids))))}
        found |= set(chosen)
        by_key: dict[tuple[Any, ...], Any] = {}
        for row in (chosen[g] for g in gate_ids if g in chosen):
            if row["alerts"]:
                raise UserError(f"{kind.noun} {row.calibration_id[:12]} was written with alerts; promote it by hand "
                                "after review")
            if not guaranteed(row):
                raise UserError(no_guarantee_refusal(row) or "")
            by_key[kind.key(row)] = row
        kind.verify_many(store, list(by_key.values()))
        for row in kind.typed(table.filter(pl.col("state").is_in(HOLDS_KEY))):
            new = by_key.get(kind.key(row))
            if new is not None and new.calibration_id != row.calibration_id:
                moves.append((row.calibration_id, "retired", f"replaced by {new.calibration_id[:12]}", []))
        made = [row for row in by_key.values() if row["state"] != "live"]
        moves += [(row.calibration_id, "live" if kind.certifies(row) else UNATTAINABLE, reason, []) for row in made]
        promoted += [row.calibration_id for row in made if kind.certifies(row)]
    missing = [g for g in gate_ids if g not in found]
    if missing:
        raise UserError(f"gate id = {missing[0]!r}: no stored gate has it in {store.path}")
    with store.transaction():
        write_moves(store, moves)
    return promoted


def _key_of(row: GateRow, columns: Sequence[str] = SERVING_KEY) -> tuple[Any, ...]:
    """A row's serving key (or those `columns` of it), with alpha and delta rounded to 12 decimals."""
    return tuple(round(float(row[c]), 12) if c in ("alpha", "delta") else row[c] for c in columns)


def promote_first_gates(store: Store, calibration_ids: Iterable[str], *, reason: str) -> list[str]:
    """Make live each of these gates (single or system) whose key has no live gate yet (the pipeline's first
    gates); one that certifies nothing (alpha unattainable) becomes the key's *unattainable* gate instead,
    replacing an earlier one. Gates with alerts or without a guarantee are left candidates. Returns the ids made
    live."""
    wanted = list(set(calibration_ids))
    if not wanted:
        return []
    moves, promoted = [], []
    for kind in KINDS:
        table = kind.table(store)
        live_keys = {kind.key(r) for r in kind.typed(table.filter(state="live"))}
        unattainable: dict[tuple[Any, ...], list[str]] = {}
        for r in kind.typed(table.filter(state=UNATTAINABLE)):
            unattainable.setdefault(kind.key(r), []).append(r.calibration_id)
        for row in kind.typed(table.filter(pl.col("calibration_id").is_in(wanted) & (pl.col("state") == "candidate"))
                              .sort("created_at")):
            key, gid = kind.key(row), row.calibration_id
            if key in live_keys or row["alerts"] or not guaranteed(row):  # no guarantee: a report result
                continue
            moves += [(old, "retired", f"replaced by {gid[:12]}", []) for old in unattainable.pop(key, [])]
            if kind.certifies(row):
                live_keys.add(key)
                moves.append((gid, "live", reason, []))
                promoted.append(gid)
            else:
                moves.append((gid, UNATTAINABLE, reason, []))
                unattainable[key] = [gid]
    write_moves(store, moves)
    return promoted


def delta_share(row: GateRow) -> float:
    """The confidence a gate spent: delta / G for one of G gates certified at once, else its delta."""
    return float(row["delta"]) / (row.get("groups") or 1)


def family_of(row: GateRow) -> tuple[Any, ...]:
    """A gate's family key: its serving key without the dataset."""
    return _key_of(row, FAMILY_KEY)


def _families(rows: Iterable[GateRow]) -> Families:
    families: Families = {}
    for row in sorted(rows, key=lambda r: r["dataset"]):
        families.setdefault(family_of(row), []).append(row)
    return families


def live_families(store: Store) -> Families:
    """Live gates by everything in their serving key but the dataset: per model, estimator, criterion, alpha,
    delta, bound and search, its live gates across datasets — the family a grouped certificate speaks for."""
    return _families(gate_rows(gates(store).filter(state="live")))


def family_spent(family: Sequence[GateRow]) -> float:
    """What the live gates of a family spent together: with probability >= 1 - this, every one holds at once
    (a union bound, whatever passes certified them)."""
    return math.fsum(delta_share(r) for r in family)


def beyond_delta(family: Sequence[GateRow]) -> bool:
    """Whether a family's live gates spent more than its delta together."""
    return family_spent(family) > family[0]["delta"] * (1 + 1e-12)


def over_budget(families: Families, spent_word: str = "spent") -> list[str]:
    """A line per family that holds a grouped gate (one that claims its model's datasets at once) and whose live
    gates spent more than the family's delta together — gates promoted from passes with different G, say."""
    lines = []
    for family in families.values():
        first, spent = family[0], family_spent(family)
        if any((r.get("groups") or 1) > 1 for r in family) and beyond_delta(family):
            shares = ", ".join(f"{r['dataset']} {delta_share(r):.4g}" for r in family)
            lines.append(f"model {first['model']!r} {first['estimator']} × {first['criterion']} "
                         f"alpha={first['alpha']:g} {first['bound']} {first['search']}: its live gates {spent_word} "
                         f"{spent:.4g} together ({shares}), more than delta = {first['delta']:g} — every one holds "
                         f"at once with probability >= {1 - spent:.4g} only; recalibrate the model's datasets "
                         f"together (calibration.group_by: dataset) and promote the whole pass")
    return lines


def held_over_budget(store: Store, gate_ids: Sequence[str]) -> dict[str, Alert]:
    """The gates among `gate_ids` whose promotion together would leave their family spending more than delta (a
    pass whose G differs from the live gates' it leaves in place): id -> why. Those wait for a person."""
    table = gates(store)
    incoming = gate_rows(table.filter(pl.col("calibration_id").is_in(list(gate_ids))))
    replaced = {_key_of(row) for row in incoming}
    staying = [row for row in gate_rows(table.filter(state="live")) if _key_of(row) not in replaced]
    ids, held = {row["calibration_id"] for row in incoming}, {}
    for key, family in _families([*staying, *incoming]).items():
        for line in over_budget({key: family}, spent_word="would spend"):
            held.update({r["calibration_id"]: Alert(OVER_BUDGET, f"family over budget: {line}") for r in family
                         if r["calibration_id"] in ids})
    return held


def flag_gates(store: Store, alerts: dict[str, Alert], prefix: str = FLAGGED,
               caused_at: datetime | None = None) -> list[str]:
    """Add an alert to each of these gates, keeping its state (an event that repeats the state with the alert
    appended): `cic gate list` shows it, a flagged candidate is never auto-promoted, a flagged live gate serves
    nothing (`flag_of`), and the next recalibration of its key alerts. With `prefix` ALERTED a live gate keeps
    serving, the alert listed (each with its kind). The event stores the prefix's code (`REASON_CODES`) and, for a
    flag an ingest's relabel or replace raised, that ingest's stamp (`caused_at`: abandoning it removes the flag).
    Retired gates are left alone; returns the gates flagged."""
    if not alerts:
        return []
    known = dict((r["calibration_id"], r) for r in current_states(store).filter(
        pl.col("calibration_id").is_in(list(alerts))).iter_rows(named=True))  # single and system gates alike
    fresh = [gid for gid in alerts if gid not in known]  # no event yet: a stored candidate, or no gate at all
    bare = stored_gate_ids(store, fresh) if fresh else set()
    rows = [*known.values(), *({"calibration_id": gid, "state": "candidate", "alerts": []} for gid in bare)]
    events = _events(store, [(row["calibration_id"], row["state"], prefix + alerts[row["calibration_id"]],
                              [*stored(row["alerts"], row.get("alert_kinds")), alerts[row["calibration_id"]]],
                              REASON_CODES[prefix], caused_at)
                             for row in rows
                             if row["state"] != "retired"])
    _write(store, events)
    return [e["calibration_id"] for e in events]


#: The gate kinds, single first (every lifecycle move above reads them).
KINDS = (GateKind("gate", gates, gate_rows, SERVING_KEY, _key_of, lambda r: r["threshold"] is not None,
                  _verify_singles),
         GateKind("system gate", system_gates, gate_rows, SYSTEM_KEY, system_key,
                  lambda r: bool(r["certified"]), _verify_systems))
