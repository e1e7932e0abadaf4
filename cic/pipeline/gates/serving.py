"""What serves, for single and system gates alike: per key, the gate speaking for it (live, or unattainable),
re-checked against the store before it serves, or an explicit "serve nothing" saying why. `live_gate` answers
`cic ask` for one key; `served_entries` is `cic gate export` for every key. One code path over `KINDS`: a
withdrawal, a retirement or an unattainable alpha reads the same for a cascade as for one model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.gates.certificates import unattainable_limits
from cic.pipeline.gates.event_log import HOLDS_KEY
from cic.pipeline.gates.gate_rows import GateRow, gate_rows
from cic.pipeline.gates.lifecycle import (
    KINDS,
    STATES,
    GateKind,
    beyond_delta,
    family_of,
    family_spent,
    gate_of,
    gates,
    kind_of,
    live_families,
    recertified,
    verify,
)
from cic.pipeline.gates.serving_state import (
    UNATTAINABLE,
    WITHOUT_GUARANTEE,
    flag_of,
    gate_command,
    guaranteed,
    no_guarantee_refusal,
    serving_state,
)
from cic.pipeline.gates.system_gates import ROUTE
from cic.pipeline.run.missing_labels import gate_assumption

if TYPE_CHECKING:
    from cic.store import Store

SINGLE, SYSTEM = KINDS


def withheld(row: GateRow) -> str | None:
    """Why the gate speaking for a key serves nothing (abstain on every question), or None when it serves: its
    alpha is unattainable, it is flagged (`flag_of`), or its search has no guarantee."""
    kind, short = kind_of(row), row["calibration_id"][:12]
    if row["state"] == UNATTAINABLE or not kind.certifies(row):
        return (f"alpha = {row['alpha']:g} is unattainable on {kind.noun} {short}'s calibration data "
                f"({row['n_cal']} labelled questions): nothing certifies it — abstain on every question (a larger "
                "alpha, or more labelled data, may reach it)")
    flag = flag_of(row)
    if flag is not None:
        return (f"live {kind.noun} {short} is flagged ({flag}); it serves nothing until a newer gate is promoted or "
                f"a person confirms it with `cic gate confirm {short}`")
    return no_guarantee_refusal(row)


def _asked(table: pl.DataFrame, asked: dict[str, Any]) -> pl.DataFrame:
    """The rows matching what was asked: alpha to 1e-12, an estimator by stored or base name, a model among a
    system's models, a criterion of None matching any; a column the table lacks matches nothing."""
    for column, value in asked.items():
        if value is None and column == "criterion":
            continue
        if column == "alpha":
            table = table.filter((pl.col("alpha") - value).abs() < 1e-12)
        elif column == "estimator" and "estimator" in table.columns:
            table = table.filter((pl.col("estimator") == value) | (schema.estimator_base_column() == value))
        elif column == "model" and "models" in table.columns:
            table = table.filter(pl.col("models").list.contains(value))
        elif column in table.columns:
            table = table.filter(pl.col(column) == value)
        else:
            return table.clear()
    return table


def live_gate(store: Store, **asked: Any) -> GateRow:
    """The gate speaking for the key `asked` names — a model's (model, dataset, estimator, criterion, alpha,
    bound, search) or a system's (system, dataset, criterion, alpha, bound) —, checked against the store (`verify`);
    an error lists the candidates when there is none, or the keys when several match. A gate that serves nothing
    comes with `withheld` = why, as `served_entries` serves it: `cic ask` abstains naming it."""
    kind = SYSTEM if "system" in asked else SINGLE
    rows = _asked(kind.table(store), asked)
    wanted = ", ".join(f"{k}={v:g}" if k == "alpha" else f"{k}={v!r}" for k, v in asked.items())
    if rows.height == 0:
        raise UserError(f"no stored gate for {wanted} in {store.path}; " + (
            serving_here(store, asked["model"], asked["dataset"]) if kind is SINGLE else
            "run `cic run` with this cascade in calibration.cascades first"))
    speaking = rows.filter(pl.col("state").is_in(HOLDS_KEY))
    if speaking.height == 0:
        raise UserError(f"no live gate for {wanted}: " + (waiting_advice(store, rows.filter(state="candidate"))
                                                          or "every gate of it was retired; promote one"))
    # what a caller may leave open (a criterion) or name by its base (an estimator) must not pick one silently
    several = [c for c in ("criterion", "estimator") if c in speaking.columns and speaking.get_column(c).n_unique() > 1]
    if several:
        differ = "; ".join(f"{c}: {', '.join(map(str, sorted(set(speaking.get_column(c).to_list()))))}"
                           for c in several)
        raise UserError(f"{wanted}: gates of several keys speak for it ({differ}); pass --{several[0]}")
    row = kind.typed(speaking.sort("state_at").tail(1))[0]
    why = withheld(row)
    if flag_of(row) is None:  # a flagged gate is out of service whatever its row says
        verify(store, row)
    return replace(row, withheld=why) if why is not None else row


def waiting_advice(store: Store, candidates: pl.DataFrame, shown: int = 3) -> str | None:
    """The newest candidates of a key (None: none waits) and the command that promotes the newest, as it runs
    here — with --despite-alerts, and why, when it carries alerts."""
    if candidates.height == 0:
        return None
    newest = candidates.sort("created_at").tail(shown).to_dicts()
    ids, last = ", ".join(r["calibration_id"][:12] for r in newest), newest[-1]
    alerts = list(last.get("alerts") or [])
    promote = gate_command("promote", last["calibration_id"], store.path, *(["--despite-alerts"] if alerts else []))
    return (f"candidates waiting for review: {ids} ({gate_command('list', None, store.path, '--state', 'candidate')});"
            + (f" the newest carries alerts ({'; '.join(alerts)}): after review {promote}" if alerts else
               f" promote the newest after review: {promote}"))


def serving_here(store: Store, model: str, dataset: str, shown: int = 8) -> str:
    """What a miss says: the gates serving for that model and dataset (ask one of them), or that none does."""
    serving = [r for r in gate_rows(gates(store, model=model, dataset=dataset).filter(state="live"))
               if serving_state(r).serves]
    if not serving:
        elsewhere = sorted({(r.model, r.dataset) for r in gate_rows(gates(store).filter(state="live"))
                            if serving_state(r).serves})
        if elsewhere:
            return (f"no gate serves for model {model!r} on {dataset!r}; gates serve here for: " + "; ".join(
                f"--model {m} --dataset {d}" for m, d in elsewhere[:shown]))
        waiting = waiting_advice(store, gates(store, model=model, dataset=dataset).filter(state="candidate"))
        return (f"no gate serves for model {model!r} on {dataset!r} (none serves in this store yet): " + (
            waiting or "a benchmark store's gates come from cic run, a production store's from cic recalibrate "
                       "and a person's promotion"))
    listed = "; ".join(f"--estimator {r.estimator} --criterion {r.criterion} --alpha {r.alpha:g} --bound {r.bound} "
                       f"--search {r.search}" for r in serving[:shown])
    more = f" (and {len(serving) - shown} more: `cic gate list --state serving`)" if len(serving) > shown else ""
    return f"gates serving for model {model!r} on {dataset!r}: {listed}{more}"


def served_entries(store: Store, **equals: Any) -> list[dict[str, Any]]:
    """What a serving system should serve, per key of every gate kind (filtered by column equality; `model` also
    picks the systems it is a stage of): the gate speaking for it, verified (`serve` = "gate", or "system" with
    every stage's threshold), or an explicit `serve` = "nothing" entry (abstain on every question, `reason` says
    why) for a key whose gates were all retired, whose gate is unattainable, flagged (`flagged` = why) or without a
    guarantee, so a serving system replaces the old gate instead of keeping it. Keys that never had a live or
    unattainable gate are left out."""
    return [entry for kind in KINDS for entry in _served(store, kind, equals)]


def _served(store: Store, kind: GateKind, equals: dict[str, Any]) -> list[dict[str, Any]]:
    table = _asked(kind.table(store), equals)
    unknown = table.filter(~pl.col("state").is_in(STATES))
    if unknown.height:  # an event log row no version of cic writes: its key must not vanish in silence
        first = unknown.row(0, named=True)
        raise UserError(f"gate {first['calibration_id'][:12]}: its newest event has state {first['state']!r}, not one "
                        f"of {', '.join(STATES)} (gate_events was edited by hand?); refusing to export — fix or remove "
                        "that event")
    shown, serve_entries, null = _SHAPES[kind.noun]
    out: list[dict[str, Any] | None] = []
    serving: list[tuple[int, Any]] = []
    parts = table.sort(*kind.key_columns).partition_by(list(kind.key_columns), maintain_order=True)
    speakers = [kind.typed(p.filter(pl.col("state").is_in(HOLDS_KEY)).sort("state_at").tail(1))[0]
                for p in parts if p.filter(pl.col("state").is_in(HOLDS_KEY)).height]
    checked = iter(recertified(store, speakers)[0])  # a gate that does not re-certify withdraws its own key
    for key_rows in parts:
        key = {k: key_rows.row(0, named=True)[k] for k in shown}
        if key_rows.filter(pl.col("state").is_in(HOLDS_KEY)).height:
            row = next(checked)
            why = withheld(row)
            if why is None:
                serving.append((len(out), row))
                out.append(None)  # filled below
                continue
            limits: dict[str, Any] = {}
            if flag_of(row) is None:  # (a flagged gate is out of service whatever its row says)
                unverified = _unverified(store, row)
                limits = {} if unverified else unattainable_limits(store, row)
                why = unverified or why + (f"; {limits.pop('why')}" if limits else "")
            out.append({"serve": "nothing", "gate_id": None, **key, **serving_state(row).fields(),
                        null: None, "reason": why, **_withheld_fields(row), **limits})
            continue
        retired = key_rows.filter(state="retired").sort("state_at")
        if retired.height:
            last = kind.typed(retired.tail(1))[0]
            out.append({"serve": "nothing", "gate_id": None, **key, **serving_state(last).fields(),
                        null: None, "retired_gate_id": last["calibration_id"],
                        "retired_at": str(last["state_at"]),
                        "reason": f"every gate of this key is retired ({last['reason']}); abstain on every question "
                                  "until one is promoted"})
    for (place, _), entry in zip(serving, serve_entries(store, [row for _, row in serving]), strict=True):
        out[place] = entry
    return [entry for entry in out if entry is not None]


def _unverified(store: Store, row: GateRow) -> str | None:
    """Why a gate that serves nothing anyway (an unattainable one) is not what its row says, or None."""
    try:
        verify(store, row)
    except UserError as exc:
        return str(exc)
    return None


def _gate_entries(store: Store, rows: Sequence[GateRow]) -> list[dict[str, Any]]:
    """A served single gate: its threshold, certificate, guarantee in words and the gate itself."""
    families = live_families(store) if rows else {}  # every dataset's: a filtered export states whole families
    return [{"serve": "gate", "gate_id": row["calibration_id"], **{k: row[k] for k in SINGLE.key_columns},
             **serving_state(row).fields(),
             "guarantee": _anytime_guarantee(row) or "high-probability" if guaranteed(row) else
             f"{_weaker_guarantee(row)}: a person opted in ({(row['reason'] or '').removeprefix(WITHOUT_GUARANTEE)})",
             "labels": gate_assumption(row),
             **{k: row[k] for k in ("threshold", "bound_value", "n_accepted", "n_errors", "n_cal")},
             "certified_with": _certified_with(row, families[family_of(row)]),
             "window_from": str(row["window_from"]), "window_to": str(row["window_to"]),
             "gate": json.loads(gate_of(row).to_json()), **_probe_of(store, row)} for row in rows]


def _probe_of(store: Store, row: GateRow) -> dict[str, Any]:
    """A gate on a probe's score carries the probe (its weights, layers, positions and fit split): a serving
    system computes the score from the model's kept states with it, no store needed."""
    from cic.store.probe_queries import probe_artifact

    if not str(row["estimator"]).startswith("probe_"):
        return {}
    artifact = probe_artifact(store, row["run_key"], row["estimator"])
    return {} if artifact is None else {"probe": json.loads(artifact)}


def _system_entries(store: Store, rows: Sequence[GateRow]) -> list[dict[str, Any]]:
    """A served system gate: every stage's model, estimator and threshold, and how to route a question."""
    return [{"serve": "system", "gate_id": row["calibration_id"], **{k: row[k] for k in _SYSTEM_SHOWN},
             **serving_state(row).fields(), "estimators": row["estimators"], "thresholds": row["thresholds"],
             "guarantee": row["guarantee"], "labels": gate_assumption(row),
             **{k: row[k] for k in ("bound_value", "n_accepted", "n_errors", "n_cal", "shares", "cost_per_question",
                                    "run_keys")},
             "live_since": str(row["state_at"]), "route": ROUTE} for row in rows]


_SYSTEM_SHOWN = (*SYSTEM.key_columns, "system_kind", "models", "delta")
#: per kind: the key fields every entry shows, how a served gate's entry is written, and the field an entry that
#: serves nothing leaves null
_SHAPES: dict[str, tuple[tuple[str, ...], Callable[[Store, Sequence[Any]], list[dict[str, Any]]], str]] = {
    SINGLE.noun: (SINGLE.key_columns, _gate_entries, "threshold"),
    SYSTEM.noun: (_SYSTEM_SHOWN, _system_entries, "thresholds")}


def _anytime_guarantee(row: GateRow) -> str | None:
    """An anytime gate's guarantee in the export's words (None for any other gate)."""
    from cic.pipeline.gates.anytime_gates import certified_since, is_anytime

    return f"anytime-valid: certified at every night since {certified_since(row)}" if is_anytime(row) else None


def _withheld_fields(row: GateRow) -> dict[str, Any]:
    """The export's fields naming the gate that serves nothing, by why (the names serving systems read)."""
    flag = flag_of(row)
    if flag is not None:
        return {"flagged_gate_id": row["calibration_id"], "flagged": flag, "flagged_at": str(row["state_at"])}
    if row["state"] == UNATTAINABLE or not kind_of(row).certifies(row):
        return {"unattainable_gate_id": row["calibration_id"], "n_cal": row["n_cal"]}
    return {"unguaranteed_gate_id": row["calibration_id"]}


def _weaker_guarantee(row: GateRow) -> str:
    """What a gate of a search without a high-probability guarantee does promise: `lec`'s holds in expectation
    over calibration sets, `paper`'s for no data-chosen threshold."""
    from cic.stats.searches import get_search

    try:
        return "in expectation only" if get_search(row["search"]).guarantee_kind == "expectation" else "none"
    except UserError:
        return "none"


def _certified_with(row: GateRow, family: Sequence[GateRow]) -> str:
    """In words, what the gate's delta covers: itself alone, or with the model's other live gates of the same
    configuration, at the confidence their shares leave together (1 - delta when they came from one pass)."""
    together = row.get("groups") or 1
    if together == 1:
        return f"alone: its error rate among accepted answers is <= alpha with probability >= 1 - {row['delta']:g}"
    spent, datasets = family_spent(family), ", ".join(r["dataset"] for r in family)
    text = (f"with the {len(family)} live gates of model {row['model']!r} on {datasets}, this one at delta / "
            f"{together}: with probability >= 1 - {spent:.4g} every one of them is <= alpha at once")
    if beyond_delta(family):
        text += (f" (more than delta = {row['delta']:g}: they come from passes with different G; recalibrate "
                 f"the model's datasets together)")
    return text
