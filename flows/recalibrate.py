"""The scheduled job: candidate gates on the newest labelled window, drift tests against the live gates' data,
stored and logged; a page (drift, a monitor alarm: `cic.pipeline.alerts`) fails the flow run with its
headline as the state message, so a schedule shows it as a failure, not a tag; warnings complete it with a note.

    stored runs + ingested streams ──► new window (after the live gate's) ──► candidates + drift tests (Holm)
        ──► DuckDB (candidates, their alerts; auto-promotion where the policy allows) ──► MLflow ──► alert? Failed

Deployed with a cron schedule by `infra/prefect.yaml`; `cic recalibrate` runs it once by hand.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed, Failed, State

from cic.pipeline.alerts import counts_line
from cic.pipeline.config import DEMO_CONFIG, flow_config
from cic.pipeline.gates.anytime_gates import ANYTIME, E_PROCESS
from cic.pipeline.production.recalibration import RecalibrationPass, WindowRule, parse_since
from cic.pipeline.run.run_results import (
    AlertRow,
    AnytimeRow,
    CandidateRow,
    DriftTestRow,
    GroupPlace,
    MonitorRow,
    RecalibrationSummary,
    SkippedGroup,
)
from cic.services.mlflow_tracking import tracking_uri
from cic.services.prefect_limits import store_slot
from cic.services.prefect_runs import flow_run_name
from cic.services.registry_sync import registry_sync
from cic.store import Store
from tasks.recalibrate import log_recalibrations, recalibrate_runs


class RecalibrationAlert(RuntimeError):
    """Raised at the end of a recalibration that raised a page (drift, a monitor alarm, …: the flow run fails);
    its message is the page's headline, `summary` holds everything the run stored and logged before."""

    def __init__(self, summary: RecalibrationSummary) -> None:
        super().__init__(summary.headline())
        self.summary = summary

    def __reduce__(self) -> tuple[Any, ...]:  # pickles by its summary, not by its message
        return type(self), (self.summary,)


class _PageWithoutTraceback(logging.Filter):
    """A deployed run that ends Failed on a page is logged by Prefect's engine as "exited with unexpected
    exception" with its traceback, which reads as a crash; on-call reads the page's headline instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, RecalibrationAlert):
            record.msg, record.args = f"recalibration ended Failed on a page: {error}", ()
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.ERROR, "ERROR"
        return True


logging.getLogger("prefect.flow_runs").addFilter(_PageWithoutTraceback())


def recalibration_run_keys(store: Store, models: list[str], datasets: list[str]) -> list[str]:
    """The config's models × datasets, plus every ingested production stream."""
    runs = store.read("runs")
    chosen = runs.filter((runs["model"].is_in(models) & runs["dataset"].is_in(datasets)) |
                         (runs["split"] == "production"))
    return chosen.get_column("run_key").to_list()


def summarize(result: RecalibrationPass) -> RecalibrationSummary:
    """The pass as typed rows for the CLI, the flow's return value and its Prefect artifact."""
    def place(key: Any, gate: Any) -> GroupPlace:  # a candidate's GateRow or a monitor's gate row
        return GroupPlace(key.model, key.dataset, key.estimator, key.criterion, gate["alpha"], gate["bound"],
                          gate["search"])

    anytime = [AnytimeRow(place(u.key, {"alpha": u.alpha, "bound": E_PROCESS, "search": ANYTIME}), u.counted_now,
                          u.counted, u.waiting, u.unlabelled, u.late, u.first_e_value, u.threshold)
               for u in result.anytime]
    return RecalibrationSummary(
        anytime=anytime, serving=list(result.serving),
        candidates=[candidate_row(c, place(c.key, c.row)) for c in [*result.candidates, *result.systems]],
        alerts=[AlertRow(place(c.key, c.row), a) for c, a in result.alerts]
        + [AlertRow(place(m.key, m.gate), m.alert()) for m in result.monitor_alarms]
        + [AlertRow(place(u.key, {"alpha": u.alpha, "bound": E_PROCESS, "search": ANYTIME}), a)
           for u, a in result.notes],
        monitors=[MonitorRow(place(m.key, m.gate), m.gate["calibration_id"], m.gate["threshold"],
                             **{k: m.row[k] for k in ("nights", "n", "k", "e_value", "alarm_at", "rate_lower_bound",
                                                      "alarmed")}, new_pairs=m.new_pairs) for m in result.monitors],
        skipped=[SkippedGroup(k.model, k.dataset, k.estimator, k.criterion, why) for k, why in result.skipped],
        tests=[DriftTestRow(k.model, k.dataset, k.estimator, k.criterion, c.test.name, c.test.p_value, c.rejected)
               for k, c in result.checks],
        promoted=list(result.promoted), withdrawn=dict(result.withdrawn))


def candidate_row(candidate: Any, place: GroupPlace) -> CandidateRow:
    """A candidate gate as the candidates table shows it, beside the live gate of its slot: a single gate's
    threshold, or a system gate's every stage's threshold."""
    row, live = candidate.row, candidate.live

    def stages(r: Any) -> tuple[float | None, ...] | None:
        return tuple(r["thresholds"]) if r.get("certified") else None

    live_stages = stages(live) if live is not None and live["state"] == "live" else None
    return CandidateRow(place, row["calibration_id"], candidate.state, row.get("threshold"), row["n_cal"],
                        live.get("threshold") if live is not None else None, list(candidate.alerts), stages(row),
                        live_stages, live_id=live["calibration_id"] if live is not None else None)


SHOWN_CANDIDATES = 500


def markdown_report(summary: RecalibrationSummary) -> str:
    """The run's results for the Prefect UI: the headline, alert counts by kind and severity, every alert, and
    the candidates table (paging candidates of live gates first, at most SHOWN_CANDIDATES rows; `cic gate list`
    has them all)."""
    from cic.pipeline.alerts import PAGE, counts_by_kind, kind_of, severity
    from cic.pipeline.gates.serving_now import markdown_table

    lines = [f"# Recalibration: {summary.gates} candidate gate(s), {len(summary.alerts)} alert(s), "
             f"{len(summary.pages)} page(s)", "", *markdown_table(summary.serving), ""]
    if summary.anytime:
        lines += ["## Anytime rule", "", *(f"- {row.line()}" for row in summary.anytime[:SHOWN_CANDIDATES]), ""]
    if summary.alerts:
        severity_of = {a.kind: a.severity for a in summary.alerts}
        lines += [f"**{summary.headline()}**", "", "| alert kind | severity | count |", "|---|---|---|",
                  *(f"| {k} | {severity_of[k]} | {n} |" for k, n in counts_by_kind(a.alert for a in summary.alerts)),
                  ""]

    def order(c: Any) -> tuple[bool, bool, bool]:
        return (not any(severity(a) == PAGE for a in c.alerts), c.shown(live=True) is None, not c.alerts)

    candidates = sorted(summary.candidates, key=order)
    lines += ["| model | dataset | estimator | criterion | α | bound | search | threshold | live | state | alerts |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in candidates[:SHOWN_CANDIDATES]:
        p = c.place
        lines.append(f"| {p.model} | {p.dataset} | {p.estimator} | {p.criterion} | {p.alpha:g} | {p.bound} | "
                     f"{p.search} | {c.shown()} | {c.shown(live=True) or '—'} | {c.state} | "
                     f"{'; '.join(c.alerts) or '—'} |")
    if len(candidates) > SHOWN_CANDIDATES:
        lines.append(f"\n{len(candidates) - SHOWN_CANDIDATES} more candidate(s): `cic gate list --state candidate`")
    if summary.alerts and len(candidates) > SHOWN_CANDIDATES:
        lines += ["", "## Every alert", ""]
        ordered = sorted(summary.alerts, key=lambda a: (kind_of(a.alert).rank, str(a.alert)))
        lines += [f"- {a.place.label}: {a.alert}" for a in ordered]
    monitors = sorted(summary.monitors, key=lambda m: (not m.alarmed, -m.e_value))
    if monitors:
        lines += ["", "## Live gates: anytime-valid monitor", "",
                  "Evidence against \"error rate among answered ≤ α\", kept since each gate went live; an alarm "
                  "(e-value ≥ live gates / level) has probability ≤ level over the whole schedule while the rate "
                  "stays ≤ α.", "",
                  "| model | dataset | estimator | criterion | α | bound | search | checks | answered | errors | "
                  "e-value | alarm at | rate ≥ | alarm |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {m.place.model} | {m.place.dataset} | {m.place.estimator} | {m.place.criterion} | "
                  f"{m.place.alpha:g} | {m.place.bound} | {m.place.search} | {m.nights} | {m.n} | {m.k} | "
                  f"{m.e_value:.3g} | {m.alarm_at:g} | {m.rate_lower_bound:.3f} | {'ALARM' if m.alarmed else '—'} |"
                  for m in monitors[:SHOWN_CANDIDATES]]
    for s in summary.skipped:
        lines.append(f"\nskipped {s.model}/{s.dataset} {s.estimator} × {s.criterion}: {s.reason}")
    return "\n".join(lines)


@flow(name="cic-recalibrate", flow_run_name=flow_run_name("recalibrate"), log_prints=True)
def recalibrate_flow(config_path: str = DEMO_CONFIG, db: str | None = None, tracking: str | None = None,
                     window: int | None = None, since: str | None = None, log_to_mlflow: bool = True,
                     fail_on_alert: bool = True, config: Any = None) -> RecalibrationSummary | State:
    """Recalibrate every stored run of the config's models × datasets and every ingested stream; fails (after
    storing and logging everything) when a test rejects or an alpha is unattainable, unless `fail_on_alert`
    is off. `config`: the `PipelineConfig` `cic recalibrate` parsed (typed `Any`: a served deployment builds its
    parameter schema without the config's module)."""
    from prefect.artifacts import create_markdown_artifact

    logger = get_run_logger()
    config = flow_config(config_path, config, db, tracking=tracking)
    policy = config.recalibration
    rule = WindowRule(count=window if window is not None else policy.window,
                      since=parse_since(since if since is not None else policy.since))
    with store_slot(config.storage.concurrency_limit, timeout_s=config.storage.queue_timeout_s):
        with Store.open(config.storage.db, read_only=True, wait_s=300) as store:
            run_keys = recalibration_run_keys(store, [m.name for m in config.models],
                                              [d.name for d in config.datasets])
        result = recalibrate_runs(config.storage.db, run_keys, config.calibration, policy, rule)
    summary = summarize(result)
    log_and_register(result, summary, config, log_to_mlflow, logger)
    create_markdown_artifact(markdown_report(summary), key="recalibration",
                             description="what serves now, candidate gates, live thresholds, states and alerts")
    log_serving_now(logger, summary)
    if summary.pages and fail_on_alert:
        alert = RecalibrationAlert(summary)
        # the run ends Failed (what a schedule, the UI and a notification see); a direct call raises `alert`,
        # `recalibrate_flow(..., return_state=True).result(raise_on_failure=False)` returns it with .summary
        return Failed(message=str(alert)[:2000], data=alert)
    assumed = labels_assumed(summary)
    if summary.alerts:  # warnings only (or pages with fail_on_alert off): Completed, the note in its message
        note = f"completed with {len(summary.alerts)} alert(s): {counts_line(a.alert for a in summary.alerts)}"
        emit_warning((note + assumed)[:2000])
        return Completed(message=(note + assumed)[:2000], data=summary)
    if assumed:  # a served gate rests on labels missing at random: said where on-call reads the run
        return Completed(message=f"completed{assumed}"[:2000], data=summary)
    return summary


def labels_assumed(summary: RecalibrationSummary) -> str:
    """The state message's clauses for served gates whose certificate assumes labels go missing at random, and
    for those a judge and people certified ("" when every served gate counts missing labels as errors alone)."""
    from cic.pipeline.run.missing_labels import ASSUMPTIONS, AT_RANDOM
    from cic.stats.calibration import JUDGED_ASSUMPTION

    out = ""
    for words, said in ((ASSUMPTIONS[AT_RANDOM], ASSUMPTIONS[AT_RANDOM]),
                        (JUDGED_ASSUMPTION, f"certified with a judge and people: {JUDGED_ASSUMPTION}")):
        resting = [r for r in summary.serving if r.serves and words in r.labels]
        if resting:
            out += f"; {len(resting)} serving gate(s) {said} ({', '.join(r.key for r in resting[:3])})"
    return out


def log_and_register(result: RecalibrationPass, summary: RecalibrationSummary, config: Any, log_to_mlflow: bool,
                     logger: Any) -> None:
    """The pass's candidates — single groups' and system keys' — to MLflow, and the registry brought in line with
    what serves now; an outage is said in `summary` (the store holds everything; `cic log` / `cic gate sync`
    catch up), never fatal."""
    if log_to_mlflow and (result.candidates or result.systems):
        try:
            summary.mlflow_run_ids = log_recalibrations(result, tracking=config.mlflow.tracking_uri,
                                                           experiment_prefix=config.mlflow.experiment_prefix)
        except Exception as exc:  # stored in DuckDB either way; the next run or `cic log` catches up
            summary.log_error = (f"{type(exc).__name__}: {exc} — the candidates are stored in "
                                    f"{config.storage.db}; once MLflow is back, `cic log` logs them")
            logger.warning("MLflow logging failed: %s", summary.log_error)
    changed = [*result.promoted, *result.withdrawn]  # what serves changed: the registry follows in the same pass
    if log_to_mlflow and changed:
        try:
            registry_sync(config.storage.db, tracking_uri(config.mlflow.tracking_uri), changed,
                          experiment_prefix=config.mlflow.experiment_prefix)
        except Exception as exc:
            summary.registry_error = (f"registry not updated ({type(exc).__name__}: {exc}) — run `cic gate sync` "
                                      "once MLflow is back")
            logger.error("%s", summary.registry_error)
    elif changed:
        summary.registry_error = "registry not updated (MLflow logging off) — run `cic gate sync` to bring it in line"


LOGGED_KEYS = 20


def log_serving_now(logger: Any, summary: RecalibrationSummary) -> None:
    """The run log's last lines: what serves now per key (serving first), the rest counted."""
    rows = summary.serving
    logger.info("serving now: %d of %d key(s) serve a gate", sum(r.serves for r in rows), len(rows))
    for row in rows[:LOGGED_KEYS]:
        logger.info("%s", row.line())
    if len(rows) > LOGGED_KEYS:
        logger.info("… %d more key(s): the run's 'recalibration' artifact and `cic gate list` list them",
                    len(rows) - LOGGED_KEYS)


WARNING_EVENT = "cic.recalibration.warning"


def emit_warning(message: str) -> None:
    """The event `infra/prefect-automations.yaml` routes to a quieter channel than a page."""
    from prefect.events import emit_event
    from prefect.runtime import flow_run

    emit_event(event=WARNING_EVENT, resource={"prefect.resource.id": f"cic.recalibration.{flow_run.id}",
                                              "prefect.resource.name": "cic-recalibrate"},
               payload={"message": message, "flow_run_name": str(flow_run.name)})
