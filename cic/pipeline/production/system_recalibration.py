"""Recalibration of system gates (cascades, chosen estimators) in the same pass as single gates, the same way.

Per system key (system, dataset, criterion, alpha, bound, search, delta) with a gate speaking for it:
1. the new questions: those labelled in every stage, seen after the newest question the speaking gate was
   certified on (by when the last stage's record was seen, as a single gate's window ends) and not among them —
   disjoint by construction —, oldest first, those whose label window has closed (`settled`: the last stage's
   record seen by now − the label window), narrowed by the window rule;
2. a candidate system gate certified on them (the same `certify_system`, same delta / K over candidates);
3. drift: per stage, the score distribution of its certified questions against the new ones (KS), and the
   live system's error rate among the new questions it answers (exact binomial) — in Holm with every other test
   of the pass;
4. the anytime-valid monitor of a live system gate over every new question (`cic.pipeline.production.monitoring`, in the
   same family as the single gates): a rejected error-rate test or an alarm withdraws it like any live gate.
A configured system's key no gate speaks for gets its first candidate on every settled question, as a new single
key does; a gate whose data an ingest changed (`--relabel`, `--replace`) pages on its key's candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from cic.pipeline.alerts import Alert
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow, gate_rows
from cic.pipeline.gates.serving_state import flag_of
from cic.pipeline.gates.system_gates import (
    SystemSpec,
    iter_system_data,
    question_times,
    speaking_system_gates,
    spec_of,
    system_calibration_rows,
    with_prior,
)
from cic.pipeline.production.monitoring import MonitorUpdate, update_of
from cic.pipeline.production.windows import (
    MIN_WINDOW,
    Check,
    WindowRule,
    changed_under,
    new_window,
    settled,
    too_few,
    unattainable_alert,
)
from cic.pipeline.run.run_results import stage_thresholds
from cic.pipeline.run.stored_calibration import GroupKey
from cic.stats.cascades import answering_model
from cic.stats.drift import ON_ANSWERED, ON_SCORES, drift_rules
from cic.store.queries import labelled_pairs_of_runs

if TYPE_CHECKING:
    from cic.pipeline.config import CalibrationConfig
    from cic.store import Store


@dataclass
class SystemRecalibration:
    """One system key's pass: the gate speaking for it (None: its first candidate), the candidate on its new
    questions, the tests, or why skipped; `key` names the system as a group (model 'a -> b', estimator 'e1 / e2')
    for tables and alerts."""

    key: GroupKey
    live: GateRow | None
    rows: pl.DataFrame
    checks: list[Check] = field(default_factory=list)
    skipped: str | None = None

    def alerts_of(self, row: ColumnReader) -> list[Alert]:
        """A candidate's alerts: alpha unattainable on the new questions, every rejected test of its key, and the
        pages of data changed under the gate speaking for it (as a single key's)."""
        out = []
        if not row["certified"]:
            reached = self.live is not None and self.live.certified and self.live.state == "live"
            out.append(unattainable_alert(reached, row["n_cal"]))
        out.extend(c.candidate_alert() for c in self.checks if c.rejected)
        return out + changed_under(self.live)

    def live_of(self, row: ColumnReader) -> GateRow | None:
        """The gate a candidate row is compared with: the one that spoke for the key."""
        return self.live


def system_group(row: GateRow) -> GroupKey:
    """A system gate's key as a group, for the tables and alerts single gates use."""
    return GroupKey(row["run_keys"][0], " -> ".join(row["models"]), row["dataset"],
                    " / ".join(row["estimators"] or [row["estimator_rule"]]), row["criterion"])


def display_gate(row: GateRow) -> dict[str, Any]:
    """A system gate as the monitor's tables read a gate (one `threshold` is meaningless for a cascade)."""
    return {**row.columns(), "threshold": None, "window_to": None}


def recalibrate_systems(store: Store, run_keys: list[str], config: CalibrationConfig, rule: WindowRule,
                        previous: dict[str, dict[str, Any]], now: datetime, through: datetime | None = None
                        ) -> tuple[list[SystemRecalibration], list[MonitorUpdate]]:
    """Every system key over these runs, as single keys are recalibrated: with a gate speaking for it, its
    candidate on the new questions and its tests, and the monitor of its live gate (e-values and alarms are set
    with the single gates' in `monitoring.finish`); a configured system's key with none (a cascade added after
    `cic run`, a stream only ingested), its first candidate on every question; a configured system with nothing to
    certify on, skipped saying why. Candidates count only questions seen by `through` (their label window
    closed); the monitors count every label."""
    speaking = speaking_system_gates(store)
    here = speaking.filter(pl.col("run_keys").list.eval(pl.element().is_in(list(run_keys))).list.all())
    results, updates = [], []
    for row in gate_rows(here):
        result, update = recalibrate_system(store, row, config, rule, previous, now, through)
        results.append(result)
        if update is not None:
            updates.append(update)
    spoken = {(r.system, r.dataset, r.criterion) for r in gate_rows(speaking)}
    return results + _first_candidates(store, run_keys, config, spoken, through), updates


def _first_candidates(store: Store, run_keys: list[str], config: CalibrationConfig,
                      spoken: set[tuple[str, str, str]], through: datetime | None) -> list[SystemRecalibration]:
    """The configured systems' keys no gate speaks for: a first candidate each (no gate before it, as a new
    single key's), or per system with none, one skipped result saying why (nothing is silent)."""
    from cic.pipeline.gates.system_gates import system_specs

    models = sorted(set(store.read("runs").filter(pl.col("run_key").is_in(run_keys)).get_column("model").to_list()))
    out = []
    for spec in system_specs(config, models):
        done = {(dataset, criterion) for name, dataset, criterion in spoken if name == spec.name}
        found = list(iter_system_data(store, run_keys, spec, through=through, skip=done))  # spoken keys: not joined
        for data in found:
            rows = system_calibration_rows(with_prior(store, data, config), config)  # a waiting candidate: itself
            out.extend(SystemRecalibration(system_group(GateRow.of(row)), None, rows.slice(i, 1))
                       for i, row in enumerate(rows.iter_rows(named=True)))  # one system key each
        if not found and not done:
            key = GroupKey("", " -> ".join(spec.models), "-", spec.estimator, "-")
            out.append(SystemRecalibration(key, None, pl.DataFrame(), skipped=(
                f"{spec.kind} {spec.name}: no first gate yet — {_why_none(store, run_keys, spec, models, through)}")))
    return out


def _why_none(store: Store, run_keys: list[str], spec: SystemSpec, models: list[str], through: datetime | None
              ) -> str:
    """Why a configured system has nothing to certify on: a model without a run, questions still within the label
    window, or no dataset every stage answered and was labelled on."""
    missing = [m for m in spec.models if m not in models]
    if missing:
        return f"model(s) {', '.join(missing)} have no run here; `cic run` (or `cic ingest`) gives it data"
    waiting = next(iter_system_data(store, run_keys, spec), None) if through is not None else None
    if waiting is not None:
        return (f"{len(waiting.question_ids)} labelled question(s) of {waiting.dataset} are within the label window "
                f"(seen after {through:%Y-%m-%d %H:%M} UTC); certified once it closes")
    return "no dataset where every one of its models has labelled, scored answers; `cic run` (or `cic ingest`) " \
           "gives it data"


def recalibrate_system(store: Store, live: GateRow, config: CalibrationConfig, rule: WindowRule,
                       previous: dict[str, dict[str, Any]], now: datetime, through: datetime | None = None
                       ) -> tuple[SystemRecalibration, MonitorUpdate | None]:
    """One system key: the monitor over every new question, then the candidate and tests on the window of those
    seen by `through`."""
    from cic.pipeline.config import CalibrationConfig

    key = system_group(live)
    times = question_times(store, live["run_keys"], live["criterion"])
    certified = times.filter(pl.col("question_id").is_in(live["question_ids"]))
    after = certified.get_column("at").max() if certified.height else None
    seen = times.filter(~pl.col("question_id").is_in(live["question_ids"]))  # after its data, as a window
    if after is not None:
        seen = seen.filter(pl.col("at") > after)
    stages = stage_pairs(store, live) if live["certified"] and flag_of(live) is None else None
    update = None
    if stages is not None:
        answered, errors, newest = _routed(stages, live, seen)
        update = update_of(key, display_gate(live), int(answered.sum()), int(errors[answered].sum()), newest,
                           previous, now)
    counted = settled(seen, through)
    window = new_window(counted, None, rule)
    if window.height < MIN_WINDOW:
        return SystemRecalibration(key, live, pl.DataFrame(), skipped=too_few(
            window.height, " in every stage since the system gate's questions", rule, seen.height - counted.height)
                                   ), update
    one = CalibrationConfig(alphas=(live["alpha"],), bounds=(live["bound"],), delta=live["delta"])
    ids = window.get_column("question_id").to_list()
    data = next((d for d in iter_system_data(store, live["run_keys"], spec_of(live), only=ids)
                 if d.dataset == live["dataset"] and d.criterion == live["criterion"]), None)
    if data is None:
        return SystemRecalibration(key, live, pl.DataFrame(), skipped="the new questions hold no pairs of every "
                                   "stage's estimators"), update
    result = SystemRecalibration(key, live, system_calibration_rows(data, one))
    if stages is not None:
        result.checks = _checks(stages, live, window)
    return result, update


def stage_pairs(store: Store, row: GateRow) -> pl.DataFrame:
    """(question_id, s0, e0, s1, e1, …): each stage's score (the gate's estimator) and error per question."""
    joined = None
    for i, (run_key, estimator) in enumerate(zip(row["run_keys"], row["estimators"], strict=True)):
        pairs = labelled_pairs_of_runs(store, [run_key], estimator=estimator, criterion=row["criterion"]) \
            .select("question_id", pl.col("score").alias(f"s{i}"), pl.col("error").alias(f"e{i}"))
        joined = pairs if joined is None else joined.join(pairs, on="question_id", how="inner")
    assert joined is not None
    return joined


def _routed(stages: pl.DataFrame, live: GateRow, seen: pl.DataFrame
            ) -> tuple[np.ndarray, np.ndarray, datetime | None]:
    """Whether the live system answers each seen question, the answering stage's error, and the newest time."""
    frame = seen.join(stages, on="question_id", how="inner")
    k = len(live["models"])
    us = [frame.get_column(f"s{i}").to_numpy() for i in range(k)]
    es = np.stack([frame.get_column(f"e{i}").to_numpy() for i in range(k)] + [np.zeros(frame.height)])
    who = answering_model(us, live["thresholds"])
    errors = es[who, np.arange(frame.height)].astype(int)
    newest = frame.get_column("at").max() if frame.height else None
    return who < k, errors, newest  # type: ignore[return-value]


def _checks(stages: pl.DataFrame, live: GateRow, window: pl.DataFrame) -> list[Check]:
    """Per stage the score shift (certified questions against the window), and the live system's error rate on
    the window; each check concerns the key's candidate and names the live gate when it tests the live rate."""
    certified = stages.filter(pl.col("question_id").is_in(live["question_ids"]))
    recent = window.join(stages, on="question_id", how="inner")
    checks = []
    for i, model in enumerate(live["models"]):
        before, after = certified.get_column(f"s{i}").to_numpy(), recent.get_column(f"s{i}").to_numpy()
        if before.size >= MIN_WINDOW and after.size >= MIN_WINDOW:
            checks.extend(Check(_for_stage(rule(before, after), i, model), []) for rule in drift_rules(ON_SCORES))
    answered, errors, _ = _routed(stages, live, window)
    where = "at the live thresholds " + stage_thresholds(live["thresholds"])
    checks.extend(Check(rule(answered, errors, alpha=live["alpha"], where=where), [],
                        live_gate_id=live["calibration_id"]) for rule in drift_rules(ON_ANSWERED))
    return checks


def _for_stage(test: Any, stage: int, model: str) -> Any:
    from dataclasses import replace

    return replace(test, detail=f"{test.detail} — stage {stage + 1}, {model}")
