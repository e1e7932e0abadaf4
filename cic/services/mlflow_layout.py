"""The MLflow layout, one module for `cic run`, `cic log` and recalibration: what a person reads in MLflow.

One run per (model, dataset, estimator, criterion) in experiment '<prefix>-<dataset>', holding
- params and group metrics (base error rate, questions, tokens; for recalibration the drift tests and alerts);
- per-α series whose step is 100·α, and the series α itself, so MLflow's chart view (`mlflow_view`: a saved view
  linked from the experiment's description) draws every model against α side by side;
- the table `per_alpha.json` (MLflow's table view): one row per α × bound × search with the certified threshold,
  its bound, FDR and coverage over the splits — a value that does not exist is written as a sentence saying why
  ("unattainable", "undefined: no split accepted anything"), never a blank;
- `gates.json`: every gate as `cic ask` and the registry read it, keyed by α, bound and search.
No nested runs: the same facts in a few requests per group instead of four per α × bound × search.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from cic import schema
from cic.pipeline.alerts import ALERT_KINDS, MONITOR_ALARM, counts_by_kind
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates.gate_rows import GateRow
from cic.pipeline.gates.lifecycle import gate_of, kind_of
from cic.pipeline.gates.system_gates import stored_system_rows
from cic.pipeline.production.recalibration import Candidate, RecalibrationPass
from cic.pipeline.run.group_reports import StoredUnit, UnitReport
from cic.pipeline.run.missing_labels import gate_assumption
from cic.pipeline.run.run_results import stage_thresholds
from cic.pipeline.run.stored_calibration import GroupKey
from cic.services.mlflow_tracking import DatasetRef, GroupLog, GroupTable
from cic.services.mlflow_view import ALPHA_SERIES, alpha_points
from cic.stats.calibration import CalibrationResult
from cic.store import Store
from cic.store.queries import generated_tokens, generations_per_question

ALPHA_STEP = "_by_alpha_pct"  # in a series' name: its step is 100·alpha (MLflow steps are integers)
TABLE_FILE = "per_alpha.json"
GATES_FILE = "gates.json"
UNATTAINABLE = "unattainable: no threshold certifies this α"
UNDEFINED = "undefined: no split accepted anything"
E_PROCESS = "none: certified by an e-process crossing 1/δ (anytime-valid), not a batch bound"
SPLIT_COLUMNS = ("fdr_mean", "fdr_std", "fdr_above_alpha", "coverage_mean", "coverage_std", "correct_coverage_mean",
                 "fails", "threshold_mean", "base_error_rate", "score_limit", "ceiling")
LIMIT_COLUMNS = ("score_limit", "ceiling")  # evaluations stored before the limits were kept have none


def _no_bound(gate: Any) -> str:
    """Why a gate has no upper bound to show: α unattainable, or an anytime gate (an e-process, no batch bound)."""
    return E_PROCESS if gate["search"] == "anytime" and gate["threshold"] is not None else UNATTAINABLE


def said(value: Any, why: str) -> Any:
    """A table cell: the value, or the sentence saying why there is none (MLflow shows a blank for null)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return why
    return value


def experiment_prefix_of(store: Store, run_key: str, explicit: str | None) -> str:
    """Where a run's groups are logged: the explicit prefix, else the one its config recorded, else "cic"."""
    if explicit:
        return explicit
    rows = store.read("runs", run_key=run_key)
    return (rows.get_column("experiment_prefix")[0] if rows.height else None) or DEFAULT_EXPERIMENT_PREFIX


def alpha_series(calibrations: pl.DataFrame, evaluations: pl.DataFrame) -> dict[str, dict[int, float | None]]:
    """threshold, UCB, FDR and coverage per (bound, search) as metrics whose step is alpha x 100, named so:
    `coverage_by_alpha_pct.cp.fixed_sequence`; `alpha_by_alpha_pct` (α itself: the x axis of CIC's chart view
    in MLflow, and its line y = α); and the two limits on coverage per α, whatever the bound and search
    (`score_limit_by_alpha_pct`, `ceiling_by_alpha_pct`: `cic.stats.limits`)."""
    series: dict[str, dict[int, float | None]] = {
        ALPHA_SERIES: dict(alpha_points(round(a * 100) for a in calibrations.get_column("alpha").to_list()))}
    for gate in calibrations.iter_rows(named=True):
        step, suffix = round(gate["alpha"] * 100), f"{gate['bound']}.{gate['search']}"
        series.setdefault(f"threshold{ALPHA_STEP}.{suffix}", {})[step] = gate["threshold"]
        series.setdefault(f"ucb{ALPHA_STEP}.{suffix}", {})[step] = gate["bound_value"]
    for row in evaluations.iter_rows(named=True):
        step, suffix = round(row["alpha"] * 100), f"{row['bound']}.{row['search']}"
        series.setdefault(f"fdr{ALPHA_STEP}.{suffix}", {})[step] = row["fdr_mean"]
        series.setdefault(f"coverage{ALPHA_STEP}.{suffix}", {})[step] = row["coverage_mean"]
        for limit in LIMIT_COLUMNS:
            if row.get(limit) is not None:
                series.setdefault(f"{limit}{ALPHA_STEP}", {})[step] = row[limit]
    return series


def _gate_entry(row: GateRow, **extra: Any) -> dict[str, Any]:
    """One entry of gates.json: the gate object beside the keys a reader looks it up by."""
    gate = json.loads(gate_of(row).to_json())
    return {"alpha": row.alpha, "bound": row.bound, "search": row.search, "calibration_id": row.calibration_id,
            "labels": gate_assumption(row), **extra, "gate": gate}


def _system_gate(row: Any) -> dict[str, Any]:
    """A system gate's entry in gates.json: what routes a question (models, estimators, thresholds in order)."""
    return {**{k: row[k] for k in ("calibration_id", "alpha", "bound", "search", "models", "estimators",
                                   "thresholds", "guarantee")}, "labels": gate_assumption(row)}


def _table(rows: Iterable[Mapping[str, Any]]) -> GroupTable:
    """Rows (one per α × bound × search) as a table and the gates beside it."""
    rows = list(rows)
    columns = list(dict.fromkeys(k for row in rows for k in row if k != "_gate"))
    gates = schema.canonical_json({"gates": [row["_gate"] for row in rows]})
    return GroupTable(TABLE_FILE, {c: [row.get(c) for row in rows] for c in columns}, {GATES_FILE: gates})


def pipeline_rows(calibrations: pl.DataFrame, evaluations: pl.DataFrame) -> list[dict[str, Any]]:
    """Per α × bound × search: the gate certified on all calibration data and what the splits measured."""
    rows = []
    for gate in calibrations.sort("search", "bound", "alpha").iter_rows(named=True):
        match = evaluations.filter(alpha=gate["alpha"], bound=gate["bound"], search=gate["search"])
        split = match.row(0, named=True) if match.height else {}
        result = CalibrationResult.from_json(gate["result_json"])
        rows.append({"alpha": gate["alpha"], "bound": gate["bound"], "search": gate["search"],
                     "delta": gate["delta"], "threshold": said(gate["threshold"], UNATTAINABLE),
                     "ucb": said(gate["bound_value"], _no_bound(gate)), "n_cal": gate["n_cal"],
                     "n_accepted": gate["n_accepted"], "n_errors": gate["n_errors"],
                     "feasible": gate["threshold"] is not None,
                     **{m: said(split.get(m), "not recorded" if m in LIMIT_COLUMNS else UNDEFINED)
                        for m in SPLIT_COLUMNS},
                     "coverage_lcb": said(result.coverage_lcb, UNATTAINABLE if result.threshold is None else
                                          "not recorded"),
                     "n_candidates": said(result.n_candidates, "not recorded"),
                     "calibration_id": gate["calibration_id"], "_gate": _gate_entry(GateRow.of(gate))})
    return rows


def question_set_digest(pairs: pl.DataFrame, unit: StoredUnit) -> str:
    """MLflow's dataset digest: the questions (dataset and ids), not the estimator or criterion that scored and
    labelled them, so one question set is one dataset version in MLflow's Datasets filter."""
    return schema.stable_hash(unit.group.dataset, *sorted(pairs.get_column("question_id").to_list()), length=36)


def pipeline_group(store: Store, unit: StoredUnit, report: UnitReport, experiment_prefix: str) -> GroupLog:
    """One pipeline group's run, from its stored rows and its rendered report (as `cic run --no-mlflow` writes)."""
    group = unit.group
    run, calibrations, evaluations, pairs = report.run, report.calibrations, report.evaluations, report.pairs
    first = evaluations.row(0, named=True)
    params = {"model": group.model, "dataset": group.dataset, "split": run["split"],
              "prompt_id": run["prompt_id"], "estimator": group.estimator, "criterion": group.criterion,
              "run_key": group.run_key, "data_fingerprint": unit.data_fingerprint,
              "generation_config": run["generation_config"], "delta": first["delta"], "n_splits": first["n_splits"],
              "cal_fraction": first["cal_fraction"], "seed": first["seed"], "n_questions": pairs.height,
              "alphas": sorted(set(evaluations.get_column("alpha").to_list())),
              "bounds": sorted(set(evaluations.get_column("bound").to_list())), "searches": list(report.searches)}
    metrics = {"base_error_rate": first["base_error_rate"], "n_questions": float(pairs.height),
               "generated_tokens": float(generated_tokens(store, group.run_key)),
               "generations_per_question": float(generations_per_question(store, group.run_key) or 0.0),
               "certified_gates": float(calibrations.get_column("threshold").is_not_null().sum()),
               "unattainable_gates": float(calibrations.get_column("threshold").is_null().sum())}
    if run.get("unanswered") is not None:
        metrics["unanswered_questions"] = float(run["unanswered"])
    if run.get("moved_requests") is not None:
        metrics["moved_requests"] = float(run["moved_requests"])
    return GroupLog(
        experiment=f"{experiment_prefix}-{group.dataset}",
        run_name=f"{group.model} · {group.estimator} · {group.criterion}", log_key=report.key,
        tags={**_group_tags(group, unit.data_fingerprint, kind="pipeline"),
              "cic.labels": gate_assumption(GateRow.of(calibrations.row(0, named=True)))},
        params=params, metrics=metrics, series=alpha_series(calibrations, evaluations),
        artifacts=[report.out / "tables", report.out / "figures",  # each renders in MLflow's artifact view
                   *[p for p in (report.out / "probe.json",) if p.is_file()]],  # a learned score: the probe itself
        table=_table(pipeline_rows(calibrations, evaluations)),
        dataset=DatasetRef(name=f"{group.dataset}/{run['split']}", digest=question_set_digest(pairs, unit),
                           source=f"{store.path.name}#run_key={group.run_key}", profile={"questions": pairs.height}))


def _group_tags(group: GroupKey, fingerprint: str, *, kind: str) -> dict[str, str]:
    """The tags every run of a group carries (pipeline and recalibration alike): MLflow's filters find them."""
    return {"cic.model": group.model, "cic.dataset": group.dataset, "cic.estimator": group.estimator,
            "cic.criterion": group.criterion, "cic.run_key": group.run_key, "cic.kind": kind,
            "cic.data_fingerprint": fingerprint}


def _threshold_cell(row: GateRow) -> Any:
    """A gate's threshold as a table shows it: a single gate's, or a system's per stage in order
    (`stage_thresholds`); why there is none when it certifies nothing."""
    if not row.is_system:
        return said(row.threshold, UNATTAINABLE)
    return stage_thresholds(row.thresholds, ".6g") if row.certified else UNATTAINABLE


def recalibration_row(item: Candidate, monitor_of: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per α × bound × search of a recalibration: the candidate beside the live gate it would replace (a system
    gate's thresholds per stage)."""
    row, live = item.row, item.live
    monitor = monitor_of.get(live.calibration_id) if live is not None else None
    no_live = "no live gate"
    single = not row.is_system
    change = (row.threshold - live.threshold if single and live is not None and None not in
              (live.threshold, row.threshold) else None)
    return {"alpha": row.alpha, "bound": row.bound, "search": row.search, "delta": row.delta,
            "state": item.state, "threshold": _threshold_cell(row),
            "ucb": said(row.bound_value, _no_bound(row) if single else UNATTAINABLE), "n_cal": row.n_cal,
            "n_accepted": row.n_accepted, "n_errors": row.n_errors, "feasible": kind_of(row).certifies(row),
            "alerts": " | ".join(item.alerts) or "none", "n_alerts": len(item.alerts),
            "live_threshold": _threshold_cell(live) if live is not None else no_live,
            "threshold_change": said(change, "none: a threshold is missing on one side" if single else
                                     "none: one threshold per stage"),
            "live_monitor_e_value": monitor["e_value"] if monitor else "no monitor",
            "live_rate_lower_bound": monitor["rate_lower_bound"] if monitor else "no monitor",
            "live_monitor_alarmed": bool(monitor["alarmed"]) if monitor else "no monitor",
            "live_monitor_answered": monitor["n"] if monitor else "no monitor",
            "certified_together": row.get("groups") or 1, "gate_id": row.calibration_id,
            "live_gate_id": live.calibration_id if live else no_live,
            "_gate": _gate_entry(row, state=item.state, alerts=list(item.alerts)) if single else {
                "calibration_id": row.calibration_id, "alpha": row.alpha, "bound": row.bound, "search": row.search,
                "state": item.state, "alerts": list(item.alerts), "gate": _system_gate(row)}}


def recalibration_groups(result: RecalibrationPass, experiment_prefix: str,
                         flow_run_id: str | None = None) -> list[GroupLog]:
    """One run per recalibrated group — a single model's, or a system key's (a cascade, an estimator chosen) —
    (cic.kind = recalibration); its drift tests as metrics."""
    by_group: dict[GroupKey, list[Candidate]] = {}
    for item in [*result.candidates, *result.systems]:
        by_group.setdefault(item.key, []).append(item)
    monitor_of = {m.gate["calibration_id"]: m.row for m in result.monitors}
    alarms_of: dict[GroupKey, int] = {}
    for alarm in result.monitor_alarms:  # counted on its group like any alert: every surface counts the same
        alarms_of[alarm.key] = alarms_of.get(alarm.key, 0) + 1
    checks_of: dict[GroupKey, list[Any]] = {}
    for key, check in result.checks:
        checks_of.setdefault(key, []).append(check)
    return [_recalibration_group(key, items, checks_of.get(key, []), alarms_of.get(key, 0), monitor_of,
                                 experiment_prefix, flow_run_id) for key, items in by_group.items()]


def alert_metrics(alerts: Sequence[str], alarms: int, checks: Sequence[Any]) -> dict[str, float]:
    """Every alert kind's count (`AlertKind.metric`: zeros too, so runs compare) and each drift test's statistic
    and smallest p-value (`<test>_statistic`, `<test>_p_value`; the score shift also as `ks_statistic` /
    `ks_p_value`, the error rate's as `min_error_rate_p_value`, the names runs logged before)."""
    counts = dict(counts_by_kind(alerts))
    out = {kind.metric: float(counts.get(kind.name, 0)) for kind in ALERT_KINDS.values()}
    out[MONITOR_ALARM.metric] += float(alarms)
    for test in dict.fromkeys(c.test.name for c in checks):
        ran = [c.test for c in checks if c.test.name == test]
        out[f"{test}_statistic"] = ran[0].statistic
        out[f"{test}_p_value"] = min(t.p_value for t in ran)
    if "score_shift_p_value" in out:
        out.update(ks_statistic=out["score_shift_statistic"], ks_p_value=out["score_shift_p_value"])
    if "error_rate_p_value" in out:
        out["min_error_rate_p_value"] = out["error_rate_p_value"]
    return out


def _recalibration_group(key: GroupKey, items: Sequence[Candidate], checks: Sequence[Any], alarms: int,
                         monitor_of: Mapping[str, Mapping[str, Any]], experiment_prefix: str,
                         flow_run_id: str | None) -> GroupLog:
    first = items[0].row
    certified = sum(kind_of(i.row).certifies(i.row) for i in items)
    metrics: dict[str, float | None] = {
        "n_window": float(first.n_cal), "alerts": float(sum(len(i.alerts) for i in items) + alarms),
        "monitor_alarms": float(alarms), "unattainable_gates": float(len(items) - certified),
        "certified_gates": float(certified)}
    metrics.update(alert_metrics([a for i in items for a in i.alerts], alarms, checks))
    tags = {**_group_tags(key, first.data_fingerprint, kind="recalibration"),
            "cic.alpha_unattainable": str(metrics["unattainable_gates"] > 0).lower(),
            "cic.shift_detected": str(any(c.rejected for c in checks) or alarms > 0).lower(),
            "cic.monitor_alarm": str(alarms > 0).lower(), "cic.alerts": str(int(metrics["alerts"] or 0)),
            "cic.labels": gate_assumption(first),
            **({"cic.system": first.system} if first.is_system else {}),
            **({"cic.flow_run_id": flow_run_id} if flow_run_id else {})}
    return GroupLog(
        experiment=f"{experiment_prefix}-{key.dataset}",
        run_name=f"recalibration · {key.model} · {key.estimator} · {key.criterion}",
        log_key=schema.stable_hash("recalibration", *sorted(i.row.calibration_id for i in items)), tags=tags,
        params={"run_key": key.run_key, "data_fingerprint": first.data_fingerprint, "n_window": first.n_cal,
                "window_from": str(first.get("window_from")), "window_to": str(first.get("window_to")),
                "drift_tests": [c.test.as_dict() | {"rejected": c.rejected} for c in checks]},
        metrics=metrics, table=_table(recalibration_row(i, monitor_of)
                                      for i in sorted(items, key=lambda i: (i.row.search, i.row.bound, i.row.alpha))))


def system_groups(store: Store, run_keys: Sequence[str] | None, experiment_prefix: str | None) -> list[GroupLog]:
    """One run per (system, dataset, criterion) the pipeline certified — a cascade, or a model's estimator chosen —
    in the dataset's experiment (cic.kind = system; as `loggable_units` for single groups, a recalibration's
    candidates are left to the recalibration's own run): per α its coverage, system FDR and each stage's share as
    series against α, and the table of every (α, bound) gate with each stage's threshold beside the split
    protocol."""
    gates = stored_system_rows(store)
    if run_keys is not None:
        wanted = list(run_keys)
        gates = gates.filter(pl.col("run_keys").list.eval(pl.element().is_in(wanted)).list.all())
    if gates.is_empty():
        return []
    protocol = store.read("system_evaluations")
    out = []
    for (system, dataset, criterion, fingerprint), part in gates.sort("created_at").group_by(
            "system", "dataset", "criterion", "data_fingerprint", maintain_order=True):
        part = part.unique(subset=["alpha", "bound", "search"], keep="last").sort("bound", "alpha")
        splits = protocol.filter(system=system, dataset=dataset, criterion=criterion, data_fingerprint=fingerprint)
        if splits.is_empty():  # a recalibration's candidate: its run is the recalibration's (`recalibration_groups`)
            continue
        out.append(_system_group(part, splits, experiment_prefix_of(store, part.get_column("run_keys")[0][0],
                                                                    experiment_prefix)))
    return out


def _system_group(gates: pl.DataFrame, splits: pl.DataFrame, prefix: str) -> GroupLog:
    first = gates.row(0, named=True)
    models = first["models"]
    series: dict[str, dict[int, float | None]] = {}
    rows = []
    for gate in gates.iter_rows(named=True):
        step, suffix = round(gate["alpha"] * 100), f"{gate['bound']}.{gate['search']}"
        match = splits.filter(alpha=gate["alpha"], bound=gate["bound"], search=gate["search"])
        split = match.row(0, named=True) if match.height else {}
        series.setdefault(f"coverage{ALPHA_STEP}.{suffix}", {})[step] = split.get("coverage_mean")
        series.setdefault(f"fdr{ALPHA_STEP}.{suffix}", {})[step] = split.get("fdr_mean")
        for model, share in zip(models, split.get("shares_mean") or [], strict=False):
            series.setdefault(f"share.{model}{ALPHA_STEP}.{suffix}", {})[step] = share
        rows.append({"alpha": gate["alpha"], "bound": gate["bound"], "search": gate["search"],
                     "delta": gate["delta"], "certified": gate["certified"],
                     **{f"threshold.{m}": said(t, "never answers" if gate["certified"] else UNATTAINABLE)
                        for m, t in zip(models, gate["thresholds"], strict=True)},
                     "estimator": gate["estimators"][0] if gate["estimators"] else UNATTAINABLE,
                     "ucb": said(gate["bound_value"], UNATTAINABLE), "n_cal": gate["n_cal"],
                     "n_accepted": gate["n_accepted"], "n_errors": gate["n_errors"],
                     **{f"share.{m}": s for m, s in zip(models, gate["shares"], strict=True)},
                     "cost_per_question": said(gate["cost_per_question"], "no costs given"),
                     **{m: said(split.get(m), UNDEFINED) for m in ("fdr_mean", "fdr_above_alpha", "coverage_mean",
                                                                   "fails")},
                     "calibration_id": gate["calibration_id"], "_gate": _system_gate(gate)})
    kind = "cascade " + " -> ".join(models) if first["system_kind"] == "cascade" else f"{models[0]} · estimator auto"
    return GroupLog(
        experiment=f"{prefix}-{first['dataset']}", run_name=f"{first['system']} ({kind}) · {first['criterion']}",
        log_key=schema.stable_hash("system", *sorted(gates.get_column("calibration_id").to_list())),
        tags={"cic.kind": "system", "cic.system": first["system"], "cic.system_kind": first["system_kind"],
              "cic.models": ",".join(models), "cic.dataset": first["dataset"], "cic.criterion": first["criterion"],
              "cic.data_fingerprint": first["data_fingerprint"]},
        params={"system": first["system"], "kind": first["system_kind"], "models": models, "dataset": first["dataset"],
                "criterion": first["criterion"], "delta": first["delta"], "candidates": first["candidates"],
                "run_keys": first["run_keys"], "guarantee": first["guarantee"]},
        metrics={"certified_gates": float(gates.get_column("certified").sum()),
                 "unattainable_gates": float((~gates.get_column("certified")).sum()),
                 "n_questions": float(first["n_cal"])},
        series=series, table=_table(rows))
