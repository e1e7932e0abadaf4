"""The anytime rule of the nightly recalibration (`recalibration.rule: anytime`): gates certified at every night.

Per group (run, estimator, criterion) and alpha a state of e-processes (`cic.stats.anytime.AnytimeState`: one per
candidate threshold of a grid of label-free score quantiles fixed when the state starts, tested in a fixed sequence)
is kept in the store (`anytime_states`, newest row per state). Each pass counts the group's records whose label
window has closed (seen at or before now − `recalibration.label_window`, `counted_through`), in record order, each
once (`anytime_counted` holds which and in what order): a record is counted with its label only once that label can
no longer be late, never because it happened to arrive. A record whose window closed without a label is counted as
an error (`calibration.missing_labels: worst_case`, the default: valid however labels go missing) or, under
`at_random`, not counted; either way it is reported (`unlabelled`), as is a label that arrived after its window
closed (`late`, never counted: the record was counted as it stood). So when wrong answers' labels arrive later than
right answers' (complaints, review queues) or never (a review queue for uncertain answers), the e-processes never
see fewer errors than there are. A pass whose newly counted records lack their label in a share above
`recalibration.max_missing_share` pages and withdraws the key's live gate. When the certified threshold widens, the
pass stores it as a gate (kind and search `anytime`, bound `e-process`) and makes it live: with probability >= 1 -
delta / G (G datasets of the model certified together), no threshold this state ever certifies has an error rate >=
alpha among its accepted answers, whatever night it is read. The monitor still watches the live gate; its alarm
withdraws the gate and restarts the state from the alarm on (a new epoch that counts only answers seen after it).

Serving re-checks the gate by replaying its state's counted answers, in their order, from the store's labels
(`recertify_anytime`): a replaced label or an edited row stops it. A key whose state cannot be carried on — it does
not parse, its counted answers are not the ones the store lists, or a label or record it counted was changed since
and replaying gives another threshold (`broken_state`) — pages, its live anytime gate is withdrawn and its state
restarts (a new epoch counting answers seen after this pass); every other key's pass goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.alerts import LATE_LABELS, STATE_BROKEN, UNCERTIFIED, UNLABELLED, Alert
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow
from cic.pipeline.run.missing_labels import (
    WORST_CASE,
    as_counted_then,
    assumption,
    keeps_missing,
    missing_share,
    policy_of,
)
from cic.pipeline.run.missing_labels import counted as counted_of
from cic.pipeline.run.stored_calibration import GroupKey, data_fingerprint, settled
from cic.stats.anytime import AnytimeState
from cic.stats.calibration import CalibrationResult

if TYPE_CHECKING:
    from cic.store import Store

ANYTIME = "anytime"          # the gate's kind and search
WARN_AFTER = 1000            # counted answers after which an alpha still uncertified is a warning
E_PROCESS = "e-process"      # its bound: Ville's inequality on a betting e-process, not a batch bound


@dataclass
class AnytimeUpdate:
    """One key after this pass: answers counted now and in all, the certified threshold, since when, and the gate
    made live this pass (None: the threshold did not widen)."""

    key: GroupKey
    alpha: float
    state_id: str
    counted_now: int
    counted: int
    threshold: float | None
    certified_since: datetime | None
    state: AnytimeState | None = None  # the state after this pass (what a widened threshold's gate is built from)
    gate_id: str | None = None
    waiting: int = 0        # labelled records whose label window is still open (counted on a later pass)
    unlabelled: int = 0     # records whose label window closed this pass without a label (errors, or left out)
    missing_share: float = 0.0  # their share of the records whose window closed this pass
    policy: str = WORST_CASE
    late: int = 0           # labels that arrived after their record's window had closed (never counted)
    through: datetime | None = None  # every record seen up to here is settled
    broken: str | None = None  # why the key's state could not be carried on (it restarted this pass)
    missing: Alert | None = None  # its newly settled records lack labels above the limit (a page; gate withdrawn)
    withdrawn: list[str] = field(default_factory=list)  # live gates withdrawn because of it

    def notes(self, *, per_key: bool, warn_after: int = WARN_AFTER) -> list[Alert]:
        """Warnings of this key tonight: records whose label window closed without a label, labels that arrived
        after their window (both once per key: `per_key`), and this alpha still uncertified after `warn_after`
        counted answers."""
        where = f"through {self.through:%Y-%m-%d %H:%M} UTC" if self.through is not None else "so far"
        out = []
        if self.broken is not None:
            gates = f"live gate {', '.join(g[:12] for g in self.withdrawn)} withdrawn; " if self.withdrawn else ""
            out.append(Alert(STATE_BROKEN, f"the anytime state of α={self.alpha:g} cannot be carried on: "
                                           f"{self.broken}; {gates}the state restarted and certifies again from "
                                           "answers seen after this pass (review what changed: `cic gate list`, "
                                           "label_events, record_events)"))
        if self.missing is not None:
            out.append(self.missing)
        if per_key and self.unlabelled:
            counted_as = ("counted as errors (calibration.missing_labels: worst_case)" if keeps_missing(self.policy)
                          else f"never counted: the gate {assumption(self.policy)}")
            out.append(Alert(UNLABELLED, f"{self.unlabelled} record(s) seen {where} have no label and their label "
                                         f"window has closed: {counted_as} (recalibration.label_window must cover "
                                         "how late labels arrive)"))
        if per_key and self.late:
            out.append(Alert(LATE_LABELS, f"{self.late} label(s) arrived after their record's label window had "
                                          "closed: never counted (widen recalibration.label_window)"))
        if self.threshold is None and self.counted >= warn_after:
            out.append(Alert(UNCERTIFIED, f"α={self.alpha:g} is still uncertified after {self.counted} counted "
                                          f"answers (the first threshold's e-value is {self.first_e_value:.3g}; it "
                                          "certifies at 1/δ): this score may not reach α at any threshold"))
        return out

    @property
    def first_e_value(self) -> float:
        """The e-value of the first threshold of the sequence: nothing certifies before it reaches 1/delta."""
        return float(np.exp(min(self.state.log_wealth[0], 700.0))) if self.state is not None else 1.0


def is_anytime(row: ColumnReader) -> bool:
    return row.get("search") == ANYTIME


def certified_since(row: ColumnReader) -> str:
    """When an anytime gate's threshold was first certified (from its plan): it holds at every night since."""
    try:
        return str(json.loads(row.get("plan_json") or "{}").get("certified_since") or "?")
    except ValueError:
        return "?"


def state_id_of(key: GroupKey, alpha: float, delta: float, groups: int, epoch: int,
                policy: str | None = WORST_CASE) -> str:
    """A state's id: a state counting unlabelled records as errors is another state than one leaving them out."""
    imputes = (WORST_CASE,) if keeps_missing(policy) else ()
    return schema.value_hash(ANYTIME, key.run_key, key.estimator, key.criterion, float(alpha), float(delta), groups,
                             epoch, *imputes)


def label_free_grid(store: Store, key: GroupKey, size: int) -> np.ndarray:
    """`size` evenly spaced quantiles (1/size, 2/size, …, 1) of every stored score of the group's run and estimator,
    labelled or not (no label is read: the grid is fixed before the e-processes see any). The sequence starts at
    the 1/size quantile, not the smallest score: a first threshold that accepts almost nothing would never cross
    and would block every threshold after it."""
    scores = store.read("scores", run_key=key.run_key).filter(
        (pl.col("estimator") == key.estimator) & pl.col("value").is_not_null()).get_column("value").to_numpy()
    if scores.size == 0:
        raise UserError(f"{key.model}/{key.dataset} {key.estimator}: no stored scores to fix the anytime grid on")
    return np.unique(np.quantile(scores, np.linspace(1 / size, 1, size)))


def update_key(store: Store, key: GroupKey, pairs: pl.DataFrame, *, alpha: float, delta: float, groups: int,
               grid_size: int, now: datetime, through: datetime | None = None,
               policy: str = WORST_CASE) -> AnytimeUpdate:
    """Count the group's answers whose label window has closed (`pairs`: question_id, score, error, at and
    `labelled`, in record order; unlabelled ones count as errors under `policy` worst_case, else are left out;
    `through`: now − the label window, default now) and are new to the key's state, store the state, and return
    the update (a widened threshold becomes a gate in the caller). Call inside a transaction."""
    from cic.store.queries import anytime_counted_ids, newest_anytime_state, unlabelled_records

    latest = newest_anytime_state(store, key.run_key, key.estimator, key.criterion, alpha, delta)
    if latest is not None and latest["state_id"] != state_id_of(key, alpha, delta, latest["groups"] or groups,
                                                                latest["epoch"], policy):
        latest = None  # a state of the other label policy: this policy's state starts afresh beside it
    broken = broken_state(store, key, latest, policy) if latest is not None else None
    if latest is not None and broken is not None:  # this key alone starts again; the pass goes on
        newest = pairs.get_column("at").max() if pairs.height else None
        restart_key(store, key, alpha=alpha, delta=delta, groups=latest["groups"] or groups, grid_size=grid_size,
                    epoch=latest["epoch"] + 1, now=now, after=newest if isinstance(newest, datetime) else None,
                    policy=policy)
        latest = newest_anytime_state(store, key.run_key, key.estimator, key.criterion, alpha, delta)
    epoch = latest["epoch"] if latest else 0
    state_id = state_id_of(key, alpha, delta, groups, epoch, policy)
    if latest is None:
        state = AnytimeState.start(label_free_grid(store, key, grid_size), alpha=alpha, delta=delta / groups)
        started = now
    else:
        state, started = AnytimeState.from_json(latest["state_json"]), latest["started_at"]
    after = latest.get("counted_through") if latest is not None else None  # settled before this pass
    if epoch > 0 and (after is None or after < started):  # restarted by an alarm: only answers seen after it
        after = started
    through = max(through or now, after) if after is not None else (through or now)
    counted = anytime_counted_ids(store, state_id)
    everything = settled(pairs, through)
    closed = counted_of(everything, None, policy)
    if after is not None:
        earlier = closed.filter((pl.col("at") <= after) & ~pl.col("question_id").is_in(list(counted)))
        late = (earlier.filter(pl.col("at") > started) if epoch > 0 else earlier).height
        closed = closed.filter(pl.col("at") > after)
    else:
        late = 0
    fresh = closed.filter(~pl.col("question_id").is_in(list(counted)))
    arrived = everything.filter(~pl.col("question_id").is_in(list(counted)))
    if after is not None:
        arrived = arrived.filter(pl.col("at") > after)
    before = state.threshold
    state.update(fresh.get_column("score").to_numpy(), fresh.get_column("error").to_numpy())
    since = latest["certified_since"] if latest is not None and state.threshold == before else (
        now if state.threshold is not None else None)
    store.upsert("anytime_counted", pl.DataFrame({
        "state_id": state_id, "question_id": fresh.get_column("question_id"),
        "position": np.arange(len(counted), len(counted) + fresh.height), "counted_at": now},
        schema=schema.ANYTIME_COUNTED.schema))
    store.upsert("anytime_states", pl.DataFrame([{
        **key.as_dict(), "state_id": state_id, "alpha": alpha, "delta": delta, "groups": groups, "epoch": epoch,
        "state_json": state.to_json(), "counted": state.seen, "threshold": state.threshold,
        "certified_since": since, "started_at": started, "created_at": now, "counted_through": through}],
        schema=schema.ANYTIME_STATES.schema))
    unlabelled = (unlabelled_records(store, key.run_key, key.estimator, key.criterion, after, through)
                  if "labelled" not in arrived.columns else int((~arrived.get_column("labelled")).sum()))
    return AnytimeUpdate(key, alpha, state_id, fresh.height, state.seen, state.threshold, since, state,
                         waiting=pairs.filter(pl.col("at") > through).height, late=late, through=through,
                         unlabelled=unlabelled, broken=broken, missing_share=missing_share(arrived), policy=policy)


def broken_state(store: Store, key: GroupKey, latest: dict[str, Any], policy: str | None = WORST_CASE) -> str | None:
    """Why a key's newest state cannot be carried on, or None: it must parse, its count must be the number of
    answers the store lists as counted, and — when a label or record it counted was changed after it counted it
    (`label_events`, `record_events`) — replaying its counted answers with the store's values now must give its
    threshold. (The full replay runs only then: it is a Python loop over every counted answer.)"""
    from cic.store.queries import anytime_counted_ids, anytime_state_row, changes_after_counting

    try:
        state = AnytimeState.from_json(latest["state_json"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"its stored state does not parse ({type(exc).__name__}: {str(exc)[:80]})"
    counted = len(anytime_counted_ids(store, latest["state_id"]))
    if counted != state.seen:
        return f"it says it counted {state.seen} answer(s), the store lists {counted}"
    changed = changes_after_counting(store, latest["state_id"], key.run_key, key.criterion)
    if not changed:
        return None
    first = anytime_state_row(store, latest["state_id"], first=True)
    try:
        grid = AnytimeState.from_json(first["state_json"]).grid if first is not None else state.grid
    except (ValueError, KeyError, TypeError):
        grid = state.grid
    replay = AnytimeState.start(grid, alpha=state.alpha, delta=state.delta)
    pairs = counted_pairs(store, key, latest["state_id"], state.seen, policy)
    if pairs.height != state.seen:
        return f"{state.seen - pairs.height} of its {state.seen} counted answer(s) have no score or label now"
    replay.update(pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy())
    if not (np.array_equal(replay.n, state.n) and np.array_equal(replay.total, state.total)):
        return (f"{changed} answer(s) it counted were relabelled or replaced since, and replaying them with the "
                f"store's values gives other evidence (threshold {replay.threshold} for {state.threshold})")
    return None


def restart(store: Store, row: GateRow, now: datetime, after: datetime | None) -> None:
    """A monitor alarm on an anytime gate: its key's state starts again (next epoch, a fresh grid), counting only
    answers seen after `after` (the newest answer the alarming pass read). Call inside a transaction."""
    from cic.store.queries import newest_anytime_state

    latest = newest_anytime_state(store, row["run_key"], row["estimator"], row["criterion"], row["alpha"],
                                  row["delta"])
    if latest is None:
        return
    key = GroupKey(row["run_key"], row["model"], row["dataset"], row["estimator"], row["criterion"])
    grid = AnytimeState.from_json(latest["state_json"]).grid.size
    restart_key(store, key, alpha=row["alpha"], delta=row["delta"], groups=latest["groups"], grid_size=grid,
                epoch=latest["epoch"] + 1, now=now, after=after, policy=policy_of(row.get("plan_json")))


def restart_key(store: Store, key: GroupKey, *, alpha: float, delta: float, groups: int, grid_size: int,
                epoch: int, now: datetime, after: datetime | None, policy: str | None = WORST_CASE) -> None:
    """Store a fresh state (epoch `epoch`, a new label-free grid) for a key that counts only answers seen after
    `after` (default now). Call inside a transaction."""
    state = AnytimeState.start(label_free_grid(store, key, grid_size), alpha=alpha, delta=delta / groups)
    store.upsert("anytime_states", pl.DataFrame([{
        **key.as_dict(), "state_id": state_id_of(key, alpha, delta, groups, epoch, policy),
        "alpha": alpha, "delta": delta, "groups": groups, "epoch": epoch,
        "state_json": state.to_json(), "counted": 0, "threshold": None, "certified_since": None,
        "started_at": after or now, "created_at": now, "counted_through": after or now}],
        schema=schema.ANYTIME_STATES.schema))


def gate_row(store: Store, update: AnytimeUpdate, *, delta: float, groups: int, now: datetime) -> pl.DataFrame:
    """The `calibrations` row of an update's certified threshold: its counts at that threshold, the level
    delta / G, and (in its plan) the state and how many of its counted answers certify it."""
    state = update.state
    assert state is not None
    pairs = counted_pairs(store, update.key, update.state_id, state.seen, update.policy)
    return schema.conform(pl.DataFrame([_row(update.key, update.state_id, state, pairs, alpha=update.alpha,
                                             delta=delta, groups=groups, since=update.certified_since, now=now,
                                             policy=update.policy)],
                                       schema=schema.CALIBRATIONS.schema), schema.CALIBRATIONS)


def _row(key: GroupKey, state_id: str, state: AnytimeState, pairs: pl.DataFrame, *, alpha: float, delta: float,
         groups: int, since: datetime | None, now: datetime, policy: str | None) -> dict[str, Any]:
    index = state.certified_index
    n = int(state.n[index])
    k = int(round(n * state.alpha - state.total[index]))
    result = CalibrationResult(state.threshold, None, n, k, float(alpha), delta / groups, E_PROCESS, ANYTIME,
                               delta / groups, state.seen, n_candidates=int(state.grid.size),
                               guarantee="anytime-valid: P(some threshold this state ever certifies has error rate "
                                         ">= alpha among accepted) <= delta (Ville; fixed sequence over a label-free "
                                         "grid)")
    fingerprint = data_fingerprint(pairs.select("question_id", "score", "error"))
    plan = {"state_id": state_id, "counted": state.seen, "certified_since": str(since)}
    if policy is not None:
        plan["missing_labels"] = policy
    return {"calibration_id": schema.value_hash(ANYTIME, state_id, state.seen, state.threshold, fingerprint),
            **{k2: v for k2, v in key.as_dict().items() if k2 != "run_key"}, "alpha": alpha, "delta": delta,
            "bound": E_PROCESS, "search": ANYTIME, "threshold": state.threshold, "bound_value": None,
            "n_accepted": n, "n_errors": k, "n_cal": state.seen, "data_fingerprint": fingerprint,
            "result_json": result.to_json(indent=None), "created_at": now, "run_key": key.run_key,
            "window_from": pairs.get_column("at").min() if pairs.height else None,
            "window_to": pairs.get_column("at").max() if pairs.height else None, "kind": ANYTIME,
            "groups": groups if groups > 1 else None, "plan_json": schema.canonical_json(plan)}


def counted_pairs(store: Store, key: GroupKey, state_id: str, counted: int,
                  policy: str | None = WORST_CASE) -> pl.DataFrame:
    """The first `counted` answers a state counted, in its order, with the labels the store holds now; under
    `worst_case` a record whose label was stored after the state counted it (or never) is the error it was
    counted as."""
    from cic.store.queries import anytime_counted_order, certified_pairs_of_runs

    order = anytime_counted_order(store, state_id).filter(pl.col("position") < counted)
    pairs = certified_pairs_of_runs(store, [key.run_key], estimator=key.estimator, criterion=key.criterion,
                                    missing=keeps_missing(policy))
    joined = order.join(pairs, on="question_id", how="inner").sort("position")
    if keeps_missing(policy):
        joined = as_counted_then(joined, pl.col("counted_at"))
    return joined.select("question_id", "position", "score", "error", "at")


def recertify_anytime(store: Store, row: GateRow) -> None:
    """Raise unless replaying the gate's state over its counted answers, in their order, with the store's labels,
    certifies its threshold with its counts (and its id is the hash of all of it)."""
    from cic.store.queries import anytime_state_row

    short = row["calibration_id"][:12]
    try:
        plan = json.loads(row["plan_json"] or "")
        state_id, counted = plan["state_id"], int(plan["counted"])
    except (ValueError, TypeError, KeyError):
        raise UserError(f"stored gate {short}: its anytime plan does not parse; refusing to serve it") from None
    first = anytime_state_row(store, state_id)  # its grid (fixed when the state started)
    if first is None:
        raise UserError(f"stored gate {short}: its anytime state is not in the store; refusing to serve it")
    key = GroupKey(row["run_key"], row["model"], row["dataset"], row["estimator"], row["criterion"])
    grid = AnytimeState.from_json(first["state_json"]).grid
    groups = row.get("groups") or 1
    replay = AnytimeState.start(grid, alpha=row["alpha"], delta=row["delta"] / groups)
    policy = policy_of(plan)
    pairs = counted_pairs(store, key, state_id, counted, policy)
    replay.update(pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy())
    again = _row(key, state_id, replay, pairs, alpha=row["alpha"], delta=row["delta"], groups=groups,
                 since=None, now=row["created_at"], policy=policy)
    for column in ("threshold", "n_accepted", "n_errors", "n_cal", "data_fingerprint", "calibration_id"):
        if again[column] != row[column]:
            raise UserError(f"stored gate {short}: {column} = {row[column]!r}, but replaying its counted answers "
                            f"gives {again[column]!r} (labels changed or the row was edited); refusing to serve it "
                            "(the next pass certifies again)")
