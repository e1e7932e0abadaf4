"""Recalibration: new candidate gates on the newest labelled window, tested against the live gate's data.

Per group (run, estimator, criterion):
1. the pairs whose label window has closed, each timed by when production saw it (`observations.observed_at`,
   for ingested records) or else when its label was stored; a record still unlabelled then counts as an error
   (`calibration.missing_labels: worst_case`) or is left out (`at_random`), and a new window where labels are
   missing in a share above `recalibration.max_missing_share` pages and withdraws the key's live gates;
2. the reference: the window the group's *live* gate was calibrated on (`window_from` .. `window_to`);
3. the new window: pairs strictly after the reference window — disjoint by construction — then the newest
   `count` of them and/or those seen within `since`; with no live gate yet, all pairs under the same rule;
4. candidate gates on the new window for every (alpha, bound, search), and the drift tests: the score
   distribution once per (run, estimator, reference window), the error rate at each live threshold.

`correct_and_alert` applies Holm across every test of the pass and turns rejections, and any alpha that is
unattainable on the new window, into alerts attached to the candidates they concern.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.alerts import MISSING_LABELS, PAGE, STATE_BROKEN, Alert, kind_of, severity, withdraws
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow, gate_rows
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.gates.serving_now import serving_now
from cic.pipeline.production.windows import (
    MIN_WINDOW,
    Check,
    WindowRule,
    changed_under,
    new_window,
    parse_since,
    settled,
    span,
    too_few,
    unattainable_alert,
)
from cic.pipeline.run.missing_labels import counted, missing_share, observable
from cic.pipeline.run.stored_calibration import (
    GroupKey,
    calibration_rows,
    group_counts,
    labelled_pairs,
    pair_columns,
    truth_of,
)
from cic.stats.drift import ON_ANSWERED, ON_SCORES, drift_rules, holm
from cic.store.queries import labelled_pairs_of_runs

if TYPE_CHECKING:
    from cic.pipeline.config import CalibrationConfig
    from cic.store import Store

__all__ = ["MIN_WINDOW", "Check", "WindowRule", "new_window", "parse_since", "recalibrate_store", "span"]
MEMORY_LIMIT = "1GB"  # DuckDB's limit while reading a pass's pairs (it spills beyond it)


@dataclass
class GroupRecalibration:
    """What recalibrating one group produced: the candidate rows, the live gates, the tests, or why skipped."""

    key: GroupKey
    rows: pl.DataFrame
    live: dict[tuple[float, float, str, str], GateRow]
    window: tuple[datetime | None, datetime | None]
    reference: tuple[datetime | None, datetime | None] | None
    checks: list[Check] = field(default_factory=list)
    skipped: str | None = None
    missing: Alert | None = None  # its new window's share of missing labels is above the limit: a page
    limits: dict[float, str] = field(default_factory=dict)  # alpha -> why it is unattainable on the new window

    def alerts_of(self, row: ColumnReader) -> list[Alert]:
        """The alerts of one candidate row: missing labels above the limit, unattainable alpha, and every rejected
        test that concerns it."""
        out = [self.missing] if self.missing is not None else []
        live = self.live.get(slot_of(row))
        if row["threshold"] is None:
            out.append(unattainable_alert(live is not None and live["threshold"] is not None, row["n_cal"],
                                          self.limits.get(round(float(row["alpha"]), 12))))
        out.extend(c.candidate_alert() for c in self.checks if c.rejected and row["calibration_id"] in c.gate_ids)
        return out + changed_under(live)

    def live_of(self, row: ColumnReader) -> GateRow | None:
        """The live gate a candidate row is compared with: its slot's."""
        return self.live.get(slot_of(row))


def _limits(recent: pl.DataFrame, unattainable: pl.DataFrame) -> dict[float, str]:
    """Per alpha no candidate certifies, why (`cic.stats.limits.window_limits`) on the window's pairs."""
    from cic.stats.limits import window_limits

    scores, errors = recent.get_column("score").to_numpy(), recent.get_column("error").to_numpy()
    return {round(float(a), 12): window_limits(scores, errors, float(a))
            for a in unattainable.get_column("alpha").unique().to_list()}


def slot_of(row: ColumnReader) -> tuple[float, float, str, str]:
    """(alpha, delta, bound, search) of a gate row: which live gate a candidate is compared with."""
    return (round(float(row["alpha"]), 12), round(float(row["delta"]), 12), row["bound"], row["search"])


def reference_window(live: Sequence[GateRow]) -> tuple[datetime | None, datetime | None] | None:
    """The window of the newest live gate (its creation time bounds a gate stored without one)."""
    if not live:
        return None
    newest = max(live, key=lambda r: r.state_at or r.created_at)
    return newest.window_from, newest.window_to or newest.created_at


def live_gates_of(store: Store, key: GroupKey) -> list[GateRow]:
    """The live gates of one group (one per alpha × delta × bound × search)."""
    return gate_rows(gates(store, run_key=key.run_key, estimator=key.estimator, criterion=key.criterion)
                     .filter(state="live"))


def recalibrate_group(store: Store, key: GroupKey, config: CalibrationConfig, rule: WindowRule,
                      shift_tests: dict[tuple[Any, ...], Check] | None = None) -> GroupRecalibration:
    """Candidates on the group's new window and its drift tests (shared score tests come from `shift_tests`)."""
    return recalibrate_pairs(key, labelled_pairs(store, key), live_gates_of(store, key), config, rule, shift_tests)


def recalibrate_pairs(key: GroupKey, pairs: pl.DataFrame, live_rows: list[GateRow],
                      config: CalibrationConfig, rule: WindowRule,
                      shift_tests: dict[tuple[Any, ...], Check] | None = None, groups: int = 1,
                      waiting: int = 0, missing_limit: float = 1.0, now: datetime | None = None
                      ) -> GroupRecalibration:
    """`recalibrate_group` on a group's settled pairs (oldest first; unlabelled ones, column `labelled` false,
    counted as errors or left out by `config.missing_labels`) and live gates already loaded; `groups`: how many
    datasets of the model are certified together (`calibration_rows`); `waiting`: its records left out because
    their label window is still open (said when it gets no candidate); `missing_limit`: the largest share of
    unlabelled records in the new window that does not page and withdraw the key's live gates; `now`: the
    pass's clock (its candidates' creation time)."""
    live = {slot_of(r): r for r in live_rows}
    reference = reference_window(live_rows)
    everything = new_window(pairs, reference[1] if reference else None, rule)
    recent = new_window(counted(pairs, None, config.label_policy(key.criterion)), reference[1] if reference else None,
                        rule)
    share = missing_share(everything)
    missing = Alert(MISSING_LABELS, f"{share:.0%} of the {everything.height} records of its new window have no label "
                                    f"after their label window closed (limit {missing_limit:.0%}): labels are not "
                                    "arriving; its live gate is withdrawn") if share > missing_limit else None
    if recent.height < MIN_WINDOW:
        since = f" since the live gate's window (to {reference[1]})" if reference else ""
        return GroupRecalibration(key, pl.DataFrame(schema=schema.CALIBRATIONS.schema), live, span(recent), reference,
                                  skipped=too_few(recent.height, since, rule, waiting), missing=missing)
    rows = calibration_rows(key, recent.select(pair_columns(recent)), config, kind="recalibration",
                            window=span(recent), groups=groups, now=now)
    truth = truth_of(recent)  # a judge-plus-people group's limits and error tests read the people's verdicts
    out = GroupRecalibration(key, rows, live, span(recent), reference, missing=missing,
                             limits=_limits(truth, rows.filter(pl.col("threshold").is_null())))
    ids_by_slot: dict[tuple[float, float, str, str], list[str]] = {}
    for row in rows.iter_rows(named=True):
        ids_by_slot.setdefault(slot_of(row), []).append(row["calibration_id"])
    new_scores = recent.get_column("score").to_numpy()
    if reference is not None:
        start, end = reference
        before = pairs.filter(pl.col("at") <= end)
        if start is not None:
            before = before.filter(pl.col("at") >= start)
        if before.height >= MIN_WINDOW:
            for rule in drift_rules(ON_SCORES):  # shared by the key's bounds and criteria: run once a pass
                cache_key = (rule.name, key.run_key, key.estimator, start, end, recent.height, span(recent))
                shared = (shift_tests or {}).get(cache_key)
                if shared is None:
                    shared = Check(rule(before.get_column("score").to_numpy(), new_scores), [])
                    if shift_tests is not None:
                        shift_tests[cache_key] = shared
                out.checks.append(shared)
                shared.gate_ids.extend(rows.get_column("calibration_id").to_list())
    scores, errors = truth.get_column("score").to_numpy(), truth.get_column("error").to_numpy()
    for slot, gate in live.items():
        if gate["threshold"] is None:
            continue
        for rule in drift_rules(ON_ANSWERED):
            test = rule(scores <= gate["threshold"], errors, alpha=gate["alpha"],
                        where=f"at the live threshold {gate['threshold']:.4g}")
            out.checks.append(Check(test, ids_by_slot.get(slot, []), live_gate_id=gate["calibration_id"]))
    return out


def correct_and_alert(results: Sequence[Any], level: float) -> dict[str, list[Alert]]:
    """Holm across every test of the pass (at family-wise `level`), single and system gates' alike; returns each
    candidate's alerts."""
    checks = list({id(c): c for r in results for c in r.checks}.values())  # a shared score test counts once
    if checks:
        rejected = holm([c.test.p_value for c in checks], level)
        for check, flag in zip(checks, rejected, strict=True):
            check.rejected = bool(flag)
    return {row["calibration_id"]: r.alerts_of(row) for r in results if r.skipped is None
            for row in r.rows.iter_rows(named=True)}


def promote_quiet(store: Store, results: Sequence[Any], alerts: dict[str, list[Alert]]
                  ) -> tuple[list[str], dict[str, Alert]]:
    """The `promotion: auto` policy, for single groups and system keys alike: a group whose candidates raised no
    page (`cic.pipeline.alerts`) has its candidates that raised nothing themselves go live — a warning such as an
    alpha this data never reaches holds back only its own gate, never the group's other gates — if they certify
    something with a guarantee (no `paper`), and only when their family's live gates would not spend more than
    delta together (`held_over_budget`, single gates: those are flagged with why and wait for a person; a system
    gate spends its own delta). A paging group waits for a person (`cic gate promote --despite-alerts`). Returns
    (promoted ids, held id -> why)."""
    from cic.pipeline.gates.lifecycle import KINDS, flag_gates, held_over_budget, promote_many
    from cic.pipeline.gates.serving_state import guaranteed

    chosen = []
    for result in results:
        rows = list(result.rows.iter_rows(named=True)) if result.skipped is None else []
        if any(severity(a) == PAGE for r in rows for a in alerts.get(r["calibration_id"], [])):
            continue
        kind = KINDS[0] if isinstance(result, GroupRecalibration) else KINDS[1]
        chosen.extend(r["calibration_id"] for r in rows
                      if not alerts.get(r["calibration_id"]) and kind.certifies(r) and guaranteed(r))
    held = held_over_budget(store, chosen)
    promoted = promote_many(store, [i for i in chosen if i not in held],
                            reason="recalibration: policy promotion=auto, no page in its group")
    flag_gates(store, held)
    return promoted, held


def rejected_live_gates(results: Sequence[Any], updates: Sequence[Any]) -> dict[str, Alert]:
    """Live gate id -> why, for each live gate this pass found failing: a test of it rejected (after Holm) whose
    alert kind withdraws (`cic.pipeline.alerts`: the error rate at its threshold) or its anytime-valid
    monitor alarmed. (A score shift pages but leaves the gates serving: it says the inputs moved, not that a threshold's
    error rate did.)"""
    out: dict[str, Alert] = {}
    for result in results:
        for check in result.checks:
            alert = check.alert()
            if check.rejected and check.live_gate_id is not None and withdraws(alert):
                out[check.live_gate_id] = alert
        missing = getattr(result, "missing", None)
        if missing is not None:  # labels are not arriving (what a failing error-rate test then says too)
            out.update({gate["calibration_id"]: missing for gate in result.live.values()})
    for update in updates:
        if update.row["alarmed"]:
            out.setdefault(update.gate["calibration_id"], update.alert())
    return out


def _already_handled(code: str | None, why: Alert) -> bool:
    """A live gate already flagged or alerted (its newest event's reason code) is not flagged again; one a person
    confirmed stays confirmed against its (sticky) monitor alarm, but not against a new failing error-rate test."""
    from cic.pipeline.alerts import MONITOR_ALARM
    from cic.pipeline.gates.serving_state import ALERTED, CONFIRMED, FLAGGED, REASON_CODES

    return code in (REASON_CODES[FLAGGED], REASON_CODES[ALERTED]) or (
        code == REASON_CODES[CONFIRMED] and kind_of(why) == MONITOR_ALARM)


def pairs_of_runs(store: Store, run_keys: Sequence[str], *, estimator: str | None = None,
                  criterion: str | None = None, missing: bool = False) -> pl.DataFrame:
    """The pairs of every group of these runs (or of one estimator / criterion) in one query: (run_key, estimator,
    criterion, question_id, score, error, at, labelled), each group's rows oldest first; `missing`: with every
    unlabelled scored record as an error (`labelled` false)."""
    return labelled_pairs_of_runs(store, run_keys, estimator=estimator, criterion=criterion, missing=missing)


@dataclass
class Candidate:
    """One new gate of a recalibration, single or system: its typed row (`GateRow`), the gate
    that spoke for its slot before the pass (None: the first gate of its key), its alerts and state after it."""

    key: GroupKey
    row: Any
    live: Any | None
    alerts: list[Alert]
    state: str


@dataclass
class RecalibrationPass:
    """What one recalibration did: candidates, groups skipped (and why), every drift test with its verdict."""

    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[tuple[GroupKey, str]] = field(default_factory=list)
    checks: list[tuple[GroupKey, Check]] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)
    monitors: list[Any] = field(default_factory=list)  # production.monitoring.MonitorUpdate, one per live gate
    withdrawn: dict[str, Alert] = field(default_factory=dict)  # live gate id -> why it stopped serving this pass
    systems: list[Candidate] = field(default_factory=list)  # candidate system gates (cascades, auto)
    anytime: list[Any] = field(default_factory=list)  # cic.pipeline.gates.anytime_gates.AnytimeUpdate, rule: anytime
    notes: list[tuple[Any, Alert]] = field(default_factory=list)  # (AnytimeUpdate, warning) of the anytime rule
    serving: list[Any] = field(default_factory=list)  # cic.pipeline.gates.serving_now.ServingRow, after the pass

    @property
    def alerts(self) -> list[tuple[Candidate, Alert]]:
        return [(c, a) for c in [*self.candidates, *self.systems] for a in c.alerts]

    @property
    def monitor_alarms(self) -> list[Any]:
        """The live gates whose anytime-valid monitor has alarmed (they stay alarmed until replaced)."""
        return [m for m in self.monitors if m.row["alarmed"]]

    def replacement_for(self, gate_id: str) -> str | None:
        """A candidate of this pass — single or system — that certifies something and would replace live gate
        `gate_id` (what the run log advises promoting when that gate was withdrawn), else None."""
        from cic.pipeline.gates.lifecycle import kind_of

        return next((c.row.calibration_id for c in [*self.candidates, *self.systems] if c.live is not None
                     and c.live.calibration_id == gate_id and kind_of(c.row).certifies(c.row)), None)


def recalibrate_store(store: Store, run_keys: Sequence[str], config: CalibrationConfig, level: float,
                      rule: WindowRule, *, auto_promote: bool = False, reason: str | None = None,
                      chunk_runs: int = 250, on_alarm: str = "withdraw", missing_limit: float = 1.0,
                      anytime_grid: int | None = None, label_window: timedelta | None = None,
                      now: datetime | None = None) -> RecalibrationPass:
    """One pass over the store: every group of the runs recalibrated (pairs read in one query per `chunk_runs`
    runs, live gates once) and every system gate over them (`cic.pipeline.production.system_recalibration`), Holm across
    all tests, candidates stored with their alerts in one transaction, quiet groups and systems promoted when
    `auto_promote`. A live gate the pass finds failing (`rejected_live_gates`) — single or system — stops
    serving (`on_alarm` "withdraw": flagged, serves nothing until a newer gate is promoted or a person confirms
    it) or keeps serving with the alert on it ("flag"). With `anytime_grid` (`recalibration.rule: anytime`) the
    single-model groups get no window candidates: each key's e-processes count the answers new to them and the
    widest certified threshold goes live (`cic.pipeline.gates.anytime_gates`); an alarm on such a gate restarts its key.
    Certificates (window candidates and the anytime states) count only records seen at least `label_window` ago,
    whose labels can no longer be late (None: 14 days where a record was ingested without its label, else 0); one
    still unlabelled then counts as an error (`config.missing_labels`). The monitor of a live gate counts every
    label as it arrives and an unlabelled record once its window closed. `now`: the pass's clock (default the
    wall clock)."""
    from cic.pipeline.gates.lifecycle import flag_gates, record_candidates
    from cic.pipeline.gates.serving_state import ALERTED, FLAGGED, REASON_CODES
    from cic.pipeline.production import monitoring
    from cic.pipeline.production.ingest import refusal
    from cic.pipeline.production.system_recalibration import recalibrate_systems

    cut = refusal(store)
    if cut:
        raise UserError(cut)
    previous, now = monitoring.previous_states(store), now or datetime.now(UTC)
    through = now - effective_label_window(store, run_keys, label_window)
    results, updates, live_rows, seen = _recalibrate_groups(store, run_keys, config, rule, previous, now, chunk_runs,
                                                            windows=anytime_grid is None, through=through,
                                                            missing_limit=missing_limit)
    systems, system_updates = recalibrate_systems(store, list(run_keys), config, rule, previous, now, through)
    updates += system_updates
    alerts = correct_and_alert([*results, *systems], level)
    monitoring.finish(updates, level)
    written = [r.rows for r in results if r.skipped is None and r.rows.height]
    new_systems = [s.rows for s in systems if s.skipped is None and s.rows.height]
    with store.transaction():
        monitoring.store_updates(store, updates)
        if written:
            store.upsert("calibrations", pl.concat(written))
        if new_systems:
            store.upsert("calibrations", pl.concat(new_systems))
        record_candidates(store, alerts, reason=reason or f"recalibration on window '{rule.describe()}'")
        live_codes = {r["calibration_id"]: r.get("reason_code")
                      for r in [*live_rows, *(s.live for s in systems if s.live is not None)]}
        failing = {gid: why for gid, why in rejected_live_gates([*results, *systems], updates).items()
                   if not _already_handled(live_codes.get(gid, REASON_CODES[FLAGGED]), why)}
        withdrawn = flag_gates(store, failing, prefix=FLAGGED if on_alarm == "withdraw" else ALERTED)
        anytime = _anytime_pass(store, seen, config, anytime_grid, withdrawn, live_rows, now, through,
                                missing_limit) if anytime_grid is not None else []
    promoted, held = promote_quiet(store, [*results, *systems], alerts) if auto_promote else ([], {})
    promoted += _promote_anytime(store, anytime)
    for gate_id, why in held.items():  # a held candidate alerts like any other: a person decides
        alerts.setdefault(gate_id, []).append(why)
    out = RecalibrationPass(promoted=promoted, monitors=updates,
                            withdrawn={gid: failing[gid] for gid in withdrawn} if on_alarm == "withdraw" else {})
    out.anytime = anytime
    out.withdrawn.update({gid: Alert(STATE_BROKEN, f"anytime state cannot be carried on: {u.broken}")
                          for u in anytime if u.broken is not None for gid in u.withdrawn})  # whatever on_alarm says
    out.withdrawn.update({gid: u.missing for u in anytime if u.missing is not None and u.broken is None
                          for gid in u.withdrawn})
    seen_keys: set[Any] = set()
    for update in anytime:
        first = (update.key.run_key, update.key.estimator, update.key.criterion) not in seen_keys
        seen_keys.add((update.key.run_key, update.key.estimator, update.key.criterion))
        out.notes += [(update, note) for note in update.notes(per_key=first)]
    _collect(store, out, results, systems, alerts)
    models = set(store.read("runs").filter(pl.col("run_key").is_in(list(run_keys))).get_column("model"))
    out.serving = serving_now(store, models, promoted, out.withdrawn)
    return out


def effective_label_window(store: Store, run_keys: Sequence[str], configured: timedelta | None) -> timedelta:
    """The label window of a pass: the configured one; none configured, 14 days when a record of these runs was
    ingested without its label (its label comes later), else 0 (labels came with their records)."""
    from cic.pipeline.run.missing_labels import DEFAULT_LABEL_WINDOW
    from cic.store.queries import ingested_without_labels

    if configured is not None:
        return configured
    return DEFAULT_LABEL_WINDOW if ingested_without_labels(store, run_keys) else timedelta(0)


def _anytime_pass(store: Store, seen: list[tuple[GroupKey, pl.DataFrame, int]], config: CalibrationConfig,
                  grid_size: int, withdrawn: list[str], live_rows: list[GateRow], now: datetime,
                  through: datetime, missing_limit: float = 1.0) -> list[Any]:
    """The anytime rule inside the pass's transaction: alarmed anytime gates restart their key, then every key's
    state counts its new answers; a widened threshold is stored as a gate (made live after the transaction). A key
    whose newly settled records lack their label in a share above `missing_limit` pages and its live gate is
    withdrawn (`missing`)."""
    from cic.pipeline.gates.anytime_gates import gate_row, is_anytime, restart, update_key
    from cic.pipeline.gates.lifecycle import flag_gates

    newest = {(k.run_key, k.estimator, k.criterion): pairs.get_column("at").max() for k, pairs, _ in seen}
    for row in live_rows:
        if row.calibration_id in withdrawn and is_anytime(row):
            restart(store, row, now, newest.get((row.run_key, row.estimator, row.criterion)))
    live = {(r.run_key, r.estimator, r.criterion, round(r.alpha, 12)): r
            for r in live_rows if is_anytime(r) and r.calibration_id not in withdrawn}
    out = []
    for key, pairs, groups in seen:
        for alpha in config.alphas:
            update = update_key(store, key, pairs, alpha=alpha, delta=config.delta, groups=groups,
                                grid_size=grid_size, now=now, through=through,
                                policy=config.label_policy(key.criterion))
            place = (key.run_key, key.estimator, key.criterion, round(alpha, 12))
            if update.missing_share > missing_limit:
                update.missing = Alert(MISSING_LABELS, f"{update.missing_share:.0%} of the records settled this pass "
                                                       f"have no label (limit {missing_limit:.0%}): labels are not "
                                                       "arriving; its live gate is withdrawn")
                if place in live:
                    update.withdrawn = flag_gates(store, {live.pop(place).calibration_id: update.missing})
            if update.broken is not None and place in live:  # its state restarted: its gate stops serving
                gone = live.pop(place)
                update.withdrawn = flag_gates(store, {gone.calibration_id: Alert(
                    STATE_BROKEN, f"its anytime state cannot be carried on ({update.broken}); withdrawn, the state "
                                  "restarted")})
            current = live.get(place)
            if update.threshold is not None and (current.threshold if current else None) != update.threshold:
                row = gate_row(store, update, delta=config.delta, groups=groups, now=now)
                store.upsert("calibrations", row)
                update.gate_id = row.get_column("calibration_id")[0]
            out.append(update)
    return out


def _promote_anytime(store: Store, updates: Sequence[Any]) -> list[str]:
    """Make each widened anytime threshold live (re-certified by replay first), retiring the one it widens. A gate
    whose replay fails is not promoted: it is flagged, its update carries why (a page), the others go live."""
    from cic.pipeline.gates.lifecycle import flag_gates, promote_many, record_candidates

    made = [u for u in updates if u.gate_id is not None]
    if not made:
        return []
    record_candidates(store, {u.gate_id: [] for u in made}, reason="recalibration: anytime rule")
    reason = "recalibration: anytime rule, certified at every night since " + str(min(u.certified_since for u in made))
    try:
        return promote_many(store, [u.gate_id for u in made], reason=reason)
    except UserError:  # one of them does not replay: promote the others, one by one, and say which
        promoted = []
        for update in made:
            try:
                promoted += promote_many(store, [update.gate_id], reason=reason)
            except UserError as exc:
                update.broken = f"its new gate {update.gate_id[:12]} does not replay ({exc})"
                with store.transaction():
                    flag_gates(store, {update.gate_id: Alert(STATE_BROKEN, f"not promoted: {exc}")})
                    update.withdrawn = _restart_broken(store, update)
        return promoted


def _restart_broken(store: Store, update: Any) -> list[str]:
    """An anytime key whose new gate did not replay: its live anytime gate withdrawn (returned) and its state
    restarted, counting answers seen after this pass. Call inside a transaction."""
    from cic.pipeline.gates.anytime_gates import ANYTIME, restart_key
    from cic.pipeline.gates.lifecycle import flag_gates
    from cic.store.queries import anytime_state_row

    key, row = update.key, anytime_state_row(store, update.state_id)
    live = gates(store).filter((pl.col("state") == "live") & (pl.col("search") == ANYTIME)
                               & (pl.col("run_key") == key.run_key) & (pl.col("estimator") == key.estimator)
                               & (pl.col("criterion") == key.criterion)
                               & ((pl.col("alpha") - update.alpha).abs() < 1e-12))
    withdrawn = flag_gates(store, {g: Alert(STATE_BROKEN, f"withdrawn: {update.broken}")
                                   for g in live.get_column("calibration_id")})
    if row is not None:
        restart_key(store, key, alpha=row["alpha"], delta=row["delta"], groups=row["groups"],
                    grid_size=update.state.grid.size, epoch=row["epoch"] + 1, now=datetime.now(UTC),
                    after=update.through)
    return withdrawn


def _recalibrate_groups(store: Store, run_keys: Sequence[str], config: CalibrationConfig, rule: WindowRule,
                        previous: dict[str, dict[str, Any]], now: datetime, chunk_runs: int, *, windows: bool = True,
                        through: datetime | None = None, missing_limit: float = 1.0
                        ) -> tuple[list[GroupRecalibration], list[Any], list[GateRow],
                                   list[tuple[GroupKey, pl.DataFrame, int]]]:
    """Every single-model group of the runs: its candidates and tests (unless `windows` is off: the anytime
    rule) on its records seen by `through` (their label window closed), the monitors of its live gates (every
    label), the live gates read, and each group's pairs with its G (pairs in one query per `chunk_runs` runs)."""
    from cic.pipeline.production import monitoring

    wanted = set(run_keys)
    runs = {r["run_key"]: r for r in store.read("runs").iter_rows(named=True) if r["run_key"] in wanted}
    live_rows = gate_rows(gates(store).filter(pl.col("run_key").is_in(list(runs)) & (pl.col("state") == "live")))
    live_by_group: dict[tuple[str, str, str], list[GateRow]] = {}
    for row in live_rows:
        live_by_group.setdefault((row.run_key, row.estimator, row.criterion), []).append(row)
    shared: dict[tuple[Any, ...], Check] = {}
    results: list[GroupRecalibration] = []
    updates: list[Any] = []
    seen: list[tuple[GroupKey, pl.DataFrame, int]] = []
    keys = sorted(runs)
    together = group_counts(runs.values(), config)
    with store.memory_limit(MEMORY_LIMIT):
        for pairs in _chunks(store, keys, chunk_runs, config):
            bounds = pairs.select("run_key", "estimator", "criterion").with_row_index("first") \
                .group_by("run_key", "estimator", "criterion", maintain_order=True) \
                .agg(pl.col("first").first(), pl.len().alias("rows"))
            values = pairs.select(*pair_columns(pairs), "at", "labelled")
            judged = "human" in pairs.columns  # judge-plus-people pairs: no anytime states on them
            for run_key, estimator, criterion, first, length in bounds.iter_rows():
                run = runs[run_key]
                key = GroupKey(run_key, run["model"], run["dataset"], estimator, criterion)
                group, live = values.slice(first, length), live_by_group.get((run_key, estimator, criterion), [])
                if config.sampled(criterion):  # people who label a random subset: the rest is not missing
                    group = group.filter(pl.col("labelled"))
                closed = settled(group, through)
                if windows:
                    results.append(recalibrate_pairs(key, closed, live, config, rule, shared,
                                                     groups=together[run["model"]],
                                                     waiting=group.height - closed.height,
                                                     missing_limit=missing_limit, now=now))
                elif not judged:
                    seen.append((key, group, together[run["model"]]))
                updates.extend(monitoring.monitor_group(key, truth_of(observable(group, through)), live, previous,
                                                        now))
            del pairs, values
    return results, updates, live_rows, seen


def _chunks(store: Store, keys: Sequence[str], chunk_runs: int, config: CalibrationConfig) -> Iterator[pl.DataFrame]:
    """The pairs of every group of `chunk_runs` runs at a time (one query), then of each judge-plus-people pair of
    criteria the config names (`calibration.judged`)."""
    from cic.store.queries import judged_pairs_of_runs

    for start in range(0, len(keys), chunk_runs):
        chunk = keys[start:start + chunk_runs]
        yield pairs_of_runs(store, chunk, missing=True)
        for judged in config.judged:
            pairs = judged_pairs_of_runs(store, chunk, judge=judged.judge, people=judged.people, missing=True)
            yield pairs.filter(pl.col("human").is_not_null().any().over("run_key"))  # runs people labelled


def _collect(store: Store, out: RecalibrationPass, results: Sequence[GroupRecalibration], systems: Sequence[Any],
             alerts: dict[str, list[Alert]]) -> None:
    """The pass's candidates of both kinds (with their state after it), skipped groups and tests, into `out`."""
    from cic.pipeline.gates.lifecycle import current_states

    ids = [r["calibration_id"] for x in [*results, *systems] if x.skipped is None
           for r in x.rows.iter_rows(named=True)]
    states = dict(current_states(store).filter(pl.col("calibration_id").is_in(ids))
                  .select("calibration_id", "state").iter_rows())
    for result in [*results, *systems]:
        if result.skipped is not None:
            out.skipped.append((result.key, result.skipped))
            continue
        out.checks.extend((result.key, c) for c in result.checks)
        single = isinstance(result, GroupRecalibration)
        (out.candidates if single else out.systems).extend(
            Candidate(result.key, GateRow.of(row), result.live_of(row),
                      alerts.get(row["calibration_id"], []), states.get(row["calibration_id"], "candidate"))
            for row in result.rows.iter_rows(named=True))
    made = [u for u in out.anytime if u.gate_id is not None]
    if made:  # the anytime rule's new gates, as candidates are shown (made live already)
        stored = {r.calibration_id: r for r in gate_rows(gates(store).filter(
            pl.col("calibration_id").is_in([u.gate_id for u in made])))}
        out.candidates.extend(Candidate(u.key, stored[u.gate_id], None, [], stored[u.gate_id].state or "candidate")
                              for u in made)
