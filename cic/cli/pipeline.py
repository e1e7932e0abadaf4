"""CLI commands of the pipeline: `cic run`, `cic recalibrate`, `cic log`, `cic ask`.

Embedded defaults (DuckDB file, MLflow SQLite, Prefect's ephemeral API, Ray in-process) unless a flag or
the environment names a real service: --db, MLFLOW_TRACKING_URI / --tracking-uri, PREFECT_API_URL,
--ray-address / RAY_ADDRESS.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from cic.cli.common import (
    TrackingOpt,
    advise_on,
    bound_choices,
    console,
    err_console,
    fmt,
    friendly_errors,
    printable,
    styled,
)
from cic.cli.runner import refuse_moved_mlflow_store, run_flow, without_flow
from cic.cli.service_logs import services_log_path
from cic.stats.searches import DEFAULT_SEARCH

if TYPE_CHECKING:
    from cic.pipeline.run.run_results import AlertRow, MonitorRow, ResultRow, SystemResultRow
from cic.errors import UserError
from cic.pipeline.config import LABEL_WINDOW_HELP, MISSING_LABELS_HELP

ConfigOpt = Annotated[str, typer.Option("--config", help="Pipeline YAML (models, datasets, estimators, ...), or the "
                                       "name of a shipped config: demo, paper, example, example_smollm2.")]
DbOpt = Annotated[str | None, typer.Option("--db", help="DuckDB file (default: the config's, ./cic.duckdb).")]


def results_tables(rows: Sequence[ResultRow], estimator: str | None) -> tuple[list[Table], list[ResultRow]]:
    """FDR / coverage / fails per alpha, bound and search for one estimator, one table per (model, dataset,
    criterion) so each fits 100 columns, and the rows shown."""
    from cic.reports.tables import mean_std
    from cic.schema import estimator_base

    names = sorted({r.estimator for r in rows})
    wanted = estimator or "semantic_entropy"
    chosen = [n for n in names if n == wanted or estimator_base(n) == wanted] or names[:1]
    shown = sorted((r for r in rows if r.estimator in chosen),
                   key=lambda r: (r.model, r.dataset, r.criterion, r.alpha, r.bound, r.search))
    tables = []
    for (model, dataset, criterion), part in itertools.groupby(shown, key=lambda r: (r.model, r.dataset,
                                                                                       r.criterion)):
        table = Table(title=printable(f"{model} · {dataset} · {criterion} — split protocol of "
                                      f"{', '.join(chosen)}: test FDR, coverage, fails"), title_justify="left")
        for column in ("search", "bound", "α", "FDR mean ± std", "coverage", "fails / splits", "base error"):
            table.add_column(column, justify="left" if column in ("search", "bound") else "right", overflow="fold")
        for r in part:
            table.add_row(*map(printable, (r.search, r.bound, f"{r.alpha:g}", mean_std(r.fdr_mean, r.fdr_std),
                                           fmt(r.coverage_mean), f"{r.fails}/{r.n_splits}", fmt(r.base_error_rate))))
        tables.append(table)
    return tables, shown


def system_tables(rows: Sequence[SystemResultRow]) -> list[Table]:
    """One table per (system, dataset, criterion): each (α, bound) gate certified on all questions and its split
    protocol."""
    from cic.pipeline.run.run_digest import SYSTEM_COLUMNS, system_cells

    tables = []
    for (system, place), part in itertools.groupby(zip(rows, system_cells(rows), strict=True),
                                                   key=lambda item: (item[1][0], item[1][1])):
        part = list(part)
        first = part[0][0]
        what = "cascade " + " -> ".join(first.models) if first.kind == "cascade" else "estimator chosen (δ/K each)"
        table = Table(title=printable(f"{system} · {place} — {what}: one guarantee for the system; split "
                                      "protocol"), title_justify="left")
        for column in SYSTEM_COLUMNS[2:]:
            table.add_column(column, justify="left" if column in SYSTEM_COLUMNS[2:5] else "right", overflow="fold")
        for _, cells in part:
            table.add_row(*map(printable, cells[2:]))
        tables.append(table)
    return tables


@friendly_errors
def run(
    config: ConfigOpt = "demo",
    db: DbOpt = None,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Join this Ray cluster "
                                                    "(default: $RAY_ADDRESS, else Ray in-process).")] = None,
    tracking_uri: TrackingOpt = None,
    report_dir: Annotated[str | None, typer.Option("--report-dir", help="Where tables and plots go.")] = None,
    estimator: Annotated[str | None, typer.Option("--show-estimator", help="Estimator of the final table.")] = None,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Skip MLflow logging (`cic log` later).")] = False,
) -> None:
    """The main job: generate → score → label → DuckDB → calibrate → split protocol → MLflow."""
    from dataclasses import asdict

    from cic.pipeline.run.preflight import preflight, probe_lines, probe_models

    checked = preflight(config, ray_address=ray_address, db=db)  # before any service starts: one second, one line
    probes = probe_models(checked)  # a served model answers one token now (≤ 5 s when down); the flow reuses it
    for line in probe_lines(checked, probes):
        console.print(printable(line), highlight=False)
    from cic.store.outputs import guard_output_dir

    guard_output_dir(report_dir or checked.storage.report_dir, "--report-dir" if report_dir else "storage.report_dir")
    from flows.pipeline import ModelsFailed, pipeline

    # the Prefect server and a local Ray stop with this command, on SIGTERM too; a SIGKILL's leftovers are
    # stopped by the next `cic run` on the same store
    summary, failed, service_log = run_flow(
        pipeline, ModelsFailed, store=db or checked.storage.db, command="run",
        mlflow_uri=tracking_uri or checked.mlflow.tracking_uri, config_path=str(config), db=db,
        ray_address=ray_address, tracking=tracking_uri, report_dir=report_dir, log_to_mlflow=not no_mlflow,
        probes={name: asdict(probe) for name, probe in probes.items()}, config=checked)
    _say_run(summary, estimator, service_log)
    if failed:
        raise typer.Exit(1)


def _say_run(summary: Any, estimator: str | None, service_log: str) -> None:
    """What `cic run` ends with: the results tables, the digest lines, where MLflow, the reports and the registry
    stand, and every model that failed (stderr)."""
    from cic.pipeline.run.run_digest import (
        generated_line,
        per_dataset_lines,
        probes_line,
        stage_times,
        unattainable_note,
    )

    tables, shown = results_tables(summary.results, estimator)
    for table in [*tables, *system_tables(summary.systems)]:
        console.print(table)
    for line in [unattainable_note(shown), *per_dataset_lines(summary), generated_line(summary),
                 probes_line(summary), f"stages: {stage_times(summary)}",
                 f"DuckDB: {summary.db}", f"Ray and MLflow service messages: {service_log}"]:
        if line:
            console.print(printable(line), highlight=False)
    if summary.log is not None:
        console.print(printable(f"MLflow ({summary.tracking_uri}): {summary.log.logged} group(s) logged, "
                                f"{summary.log.already} already there"), highlight=False)
        say_views(summary.tracking_uri, summary.log.views)
        console.print(printable(f"tables and plots: {summary.report_dir}/ (also attached to the MLflow runs)"),
                      highlight=False)
    if summary.log is None and summary.reports:
        console.print(printable(f"tables and plots: {summary.report_dir}/ ({summary.reports} group(s); `cic log` "
                                "attaches them to MLflow runs)"), highlight=False)
    if summary.log_error:
        err_console.print(styled(("MLflow logging failed:", "bold yellow"), printable(
            f" {summary.log_error} — results are in {summary.db}; run `cic log` to log them")))
    if summary.registered:
        console.print(printable(f"registry: {len(summary.live)} live gate(s) in {len(set(summary.registered))} "
                                "registered model(s), each behind its alias"), highlight=False)
    if summary.registry_error:
        err_console.print(styled(("REGISTRY", "bold yellow"), printable(f" {summary.registry_error}")),
                          soft_wrap=True)
    for item in summary.failed_models:
        err_console.print(styled(("FAILED", "bold red"), printable(
            f" model {item.model}: {item.error} — its stored batches are kept; rerun the same command to retry "
            "only it")), soft_wrap=True)


SHOWN_ALERTS = 10
SHOWN_CANDIDATES = 50


def print_alerts(alerts: Sequence[AlertRow]) -> None:
    """Each alert on its own line when there are few; else counts per kind and the worst SHOWN_ALERTS (the full
    list is in the flow run's `recalibration` artifact and in `cic gate list`)."""
    from cic.pipeline.alerts import counts_by_kind, headline, kind_of

    ordered = sorted(alerts, key=lambda a: kind_of(a.alert).rank)
    if ordered:
        head = headline([(a.place.label, a.alert) for a in ordered])
        style = "bold red" if ordered[0].severity == "page" else "bold yellow"
        err_console.print(styled((head.split(" ", 1)[0], style), printable(" " + head.split(" ", 1)[1])),
                          highlight=False, soft_wrap=True)
    if len(alerts) > SHOWN_ALERTS:
        groups = len({(a.place.model, a.place.dataset, a.place.estimator, a.place.criterion) for a in alerts})
        counts = counts_by_kind(a.alert for a in ordered)
        err_console.print(styled(("ALERTS", "bold red"), f" {len(alerts)} in {groups} group(s): " + ", ".join(
            f"{kind} × {n}" for kind, n in counts) + f"; the {SHOWN_ALERTS} worst follow, the full list is "
            "in the flow run's 'recalibration' artifact and `cic gate list --state candidate`"), soft_wrap=True)
    for alert in ordered[1:SHOWN_ALERTS]:  # the first is the headline
        err_console.print(styled((alert.severity.upper(), "bold red" if alert.severity == "page" else "yellow"),
                                 printable(f" {alert.place.label}: {alert.alert}")), highlight=False, soft_wrap=True)


def _refuse_unfinished_ingests(db: str) -> None:
    """Before any service starts: a store whose large ingest was cut off is completed first."""
    from cic.pipeline.production.ingest import unfinished_ingests
    from cic.store import Store
    from cic.store.database import StoreError

    try:
        with Store.open(db, read_only=True, wait_s=60) as store:
            cut = unfinished_ingests(store)
    except StoreError:
        return  # an older layout (no journal yet) or a writer holding the file: the flow checks again
    if cut:
        raise UserError(f"the ingest of {cut[0]!r} was cut off before its last commit; rerun `cic ingest {cut[0]} "
                         f"--db {db}` to complete it, then recalibrate")


def print_monitors(monitors: Sequence[MonitorRow]) -> None:
    """The live gates' anytime-valid monitors: alarmed first, then by evidence (at most SHOWN_CANDIDATES)."""
    if not monitors:
        return
    table = Table(title=f"live gates: anytime-valid monitor ({len(monitors)}; alarm at e-value ≥ live gates / level)")
    for column in ("model", "dataset", "estimator", "α", "checks", "answered", "errors", "e-value", "rate ≥",
                   "alarm"):
        table.add_column(column, overflow="fold")  # wrapped, never cut with "…"
    ordered = sorted(monitors, key=lambda m: (not m.alarmed, -m.e_value))
    for m in ordered[:SHOWN_CANDIDATES]:
        table.add_row(*map(printable, (m.place.model, m.place.dataset, m.place.estimator, f"{m.place.alpha:g}",
                                       str(m.nights), str(m.n), str(m.k), f"{m.e_value:.3g}",
                                       f"{m.rate_lower_bound:.3f}", "ALARM" if m.alarmed else "—")))
    console.print(table)


@friendly_errors
def recalibrate(
    config: ConfigOpt = "demo",
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    window: Annotated[int | None, typer.Option("--window", help="Use the newest N new labelled questions.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Use new questions seen within this long (7d, 12h).")]
    = None,
    fail_on_alert: Annotated[bool, typer.Option("--fail-on-alert/--no-fail-on-alert", help="Exit 1 (and fail the "
                                                "flow run) on a page: drift, a monitor alarm, a live gate's alpha "
                                                "become unattainable; warnings never fail it.")] = True,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Skip MLflow logging.")] = False,
    label_window: Annotated[str | None, typer.Option("--label-window", help="recalibration.label_window: "
                                                     + LABEL_WINDOW_HELP + ".")] = None,
    missing_labels: Annotated[str | None, typer.Option("--missing-labels", help="calibration.missing_labels: "
                                                       + MISSING_LABELS_HELP + ".")] = None,
) -> None:
    """Candidate gates on labelled questions newer than each live gate's window, tested for drift against it;
    candidates wait for `cic gate promote` (or go live under `promotion: auto`). A record counts toward a
    certificate only once its label window has closed (`--label-window`); one whose label never came then counts
    as an error (`--missing-labels`)."""
    from cic.pipeline.run.preflight import check_store

    checked = _recalibration_config(config, window, since, label_window, missing_labels)  # before any service
    resolved_db = db or checked.storage.db
    check_store(resolved_db, must_exist=True, option="--db" if db else "storage.db")
    advise_on(resolved_db)
    _refuse_unfinished_ingests(resolved_db)
    from flows.recalibrate import RecalibrationAlert, recalibrate_flow

    # Prefect's ephemeral server stops with this command, also when it is killed (see owned_processes)
    result, failed, _ = run_flow(
        recalibrate_flow, RecalibrationAlert, store=resolved_db, command="recalibrate",
        mlflow_uri=tracking_uri or checked.mlflow.tracking_uri, config_path=str(config), db=db, tracking=tracking_uri,
        window=window, since=since, log_to_mlflow=not no_mlflow, fail_on_alert=fail_on_alert, config=checked)
    print_candidates(result)
    print_recalibration_notes(result, failed, f"nothing to recalibrate: {resolved_db} holds no labelled results for "
                              f"the models and datasets of {config} (run `cic run --config {config}` first, or "
                              "check --db)", db=str(resolved_db))
    if failed:
        raise typer.Exit(1)


def _recalibration_config(config: str, window: int | None, since: str | None, label_window: str | None,
                          missing_labels: str | None = None) -> Any:
    """The pipeline config with --label-window and --missing-labels applied, the window options checked."""
    from cic.pipeline.config import load_config
    from cic.pipeline.production.recalibration import WindowRule, parse_since
    from cic.pipeline.run.durations import parse_duration
    from cic.pipeline.run.missing_labels import POLICIES

    checked = load_config(config)
    WindowRule(count=window, since=parse_since(since))
    if missing_labels is not None:
        if missing_labels not in POLICIES:
            raise UserError(f"--missing-labels = {missing_labels!r}: one of {', '.join(POLICIES)}")
        calibration = checked.calibration.model_copy(update={"missing_labels": missing_labels})
        checked = checked.model_copy(update={"calibration": calibration})
    if label_window is None:
        return checked
    parse_duration(label_window, "--label-window")
    policy = checked.recalibration.model_copy(update={"label_window": label_window})
    return checked.model_copy(update={"recalibration": policy})


def _group_of(p: Any) -> str:
    return f"{p.model}/{p.dataset} {p.estimator} × {p.criterion}"


CANDIDATE_COLUMNS = ("gate", "state", "model · dataset", "estimator · criterion", "α", "bound · search", "n",
                     "threshold", "live")


def print_candidates(result: Any) -> None:
    """The candidate gates (those with alerts first, at most SHOWN_CANDIDATES), fitted to the console without
    breaking a word, and the live gates' monitors. One group (a nightly pass over one stream) is named once, in
    the title."""
    from cic.cli.fitted_table import plain_table

    groups = {_group_of(c.place) for c in result.candidates}
    one = len(groups) == 1
    columns = [c for c in CANDIDATE_COLUMNS if not (one and "·" in c and c != "bound · search")]
    shown = sorted(result.candidates, key=lambda c: not c.alerts)[:SHOWN_CANDIDATES]
    cells = [tuple(map(printable, (
        r.gate_id[:12], r.state, *([] if one else [f"{r.place.model} · {r.place.dataset}",
                                                   f"{r.place.estimator} · {r.place.criterion}"]),
        f"{r.place.alpha:g}", f"{r.place.bound} · {r.place.search}", str(r.n_window), r.shown() or "",
        r.shown(live=True) or "—"))) for r in shown]
    if result.candidates:
        console.print(plain_table(printable(f"recalibration: {result.gates} candidate gate(s)"
                                            + (f" of {next(iter(groups))}" if one else "")), columns, cells,
                                  lead=2 if one else 3))
    print_monitors(result.monitors)


def print_recalibration_notes(result: Any, failed: bool, nothing: str, db: str | None = None) -> None:
    """What on-call reads after the table: skipped groups, alerts, withdrawn gates, registry and MLflow trouble,
    and what to do next (`nothing`: the line when there was nothing to recalibrate), each command naming the store
    `db` so that it runs as printed."""
    if len(result.candidates) > SHOWN_CANDIDATES:
        console.print(f"{len(result.candidates) - SHOWN_CANDIDATES} more candidate(s) not shown: `cic gate list "
                      "--state candidate`", soft_wrap=True)
    for skipped in result.skipped[:SHOWN_ALERTS]:
        console.print(printable(f"skipped {skipped.model}/{skipped.dataset} {skipped.estimator} × "
                                f"{skipped.criterion}: {skipped.reason}"), soft_wrap=True)
    if len(result.skipped) > SHOWN_ALERTS:
        console.print(f"{len(result.skipped) - SHOWN_ALERTS} more group(s) skipped (the flow run's log and "
                      "artifact list them)", soft_wrap=True)
    for row in result.anytime[:SHOWN_CANDIDATES]:
        console.print(printable(f"anytime {row.line()}"), soft_wrap=True)
    if not result.candidates and not result.skipped and not result.anytime and not result.monitors:
        console.print(nothing, soft_wrap=True)
    if result.tests:
        console.print(f"drift tests: {len(result.tests)}, {sum(t.rejected for t in result.tests)} rejected (Holm "
                      "across the pass)", soft_wrap=True)
    if result.mlflow_run_ids:
        console.print(f"MLflow: {len(result.mlflow_run_ids)} candidate run(s) logged", soft_wrap=True)
    print_alerts(result.alerts)
    for gate_id, why in result.withdrawn.items():
        err_console.print(styled(("WITHDRAWN", "bold red"), printable(
            f" live gate {gate_id[:12]} serves nothing from now on: {why} — {restore_advice(result, gate_id, db)}")),
            highlight=False, soft_wrap=True)
    if result.registry_error:
        err_console.print(styled(("REGISTRY", "bold yellow"), printable(f" {result.registry_error}")),
                          soft_wrap=True)
    if result.alerts and not failed:
        console.print(printable(f"completed with {len(result.alerts)} alert(s), none paging"
                                if not result.pages else f"{len(result.pages)} page(s) not failing the run "
                                "(--no-fail-on-alert)"), soft_wrap=True)
    if result.log_error:
        err_console.print(styled(("MLflow logging failed:", "bold yellow"), printable(f" {result.log_error}")),
                          soft_wrap=True)
    reviewable = sorted((c for c in result.candidates if c.state == "candidate" and not c.unattainable),
                        key=lambda c: (bool(c.alerts), (c.place.bound, c.place.search) != ("cp", DEFAULT_SEARCH)))
    if reviewable and not result.promoted:
        console.print(review_line(reviewable[0], db), soft_wrap=True)
    print_serving_now(result.serving)


def review_line(first: Any, db: str | None) -> str:
    """Where candidates wait and the command that promotes `first` (one without alerts when there is one, of the
    bound and search `cic ask` asks by default when there is one), as it runs from here; one with alerts is advised
    with --despite-alerts and the alerts it needs reviewed."""
    from cic.pipeline.gates.serving_state import gate_command

    listed = gate_command("list", None, db, "--state", "candidate")
    if first.alerts:
        return (f"candidates wait for review: {listed}; each carries alerts — e.g. {first.gate_id[:12]} "
                f"({'; '.join(first.alerts)}): after review "
                f"{gate_command('promote', first.gate_id, db, '--despite-alerts')}")
    return f"candidates wait for review: {listed}, then e.g. {gate_command('promote', first.gate_id, db)}"


def restore_advice(result: Any, gate_id: str, db: str | None = None) -> str:
    """What brings a withdrawn key back, as the case is: the anytime rule certifies again on its own; a candidate
    that certifies can be promoted (with --despite-alerts when it carries alerts); else more labelled data (or a
    person's confirmation)."""
    from cic.pipeline.gates.serving_state import restore_advice as advice

    anytime = any(r.gate_id == gate_id and r.key.endswith(" anytime") for r in result.serving)
    ready = [c for c in result.candidates if c.live_id == gate_id and not c.unattainable]
    return advice(gate_id, anytime=anytime, ready=ready[0].gate_id if ready else None,
                  ready_alerts=[str(a) for a in ready[0].alerts] if ready else (), db=db)


def print_serving_now(rows: Sequence[Any]) -> None:
    """The console's last lines: what serves now per key (serving first; `cic gate list` has every key)."""
    if not rows:
        return
    console.print(f"serving now: {sum(r.serves for r in rows)} of {len(rows)} key(s) serve a gate", soft_wrap=True)
    for row in rows[:SHOWN_ALERTS]:
        console.print(printable(f"  {row.line()}"), soft_wrap=True, highlight=False)
    if len(rows) > SHOWN_ALERTS:
        console.print(f"  … {len(rows) - SHOWN_ALERTS} more: `cic gate list --state live`", soft_wrap=True)


@friendly_errors
def log_command(
    table: Annotated[Path | None, typer.Argument(help="A long (score, error) table (Parquet, CSV or JSON lines: "
                                                      "model, dataset, estimator, criterion, score, error, "
                                                      "question_id) to "
                                                      "calibrate, evaluate and log in the pipeline's layout; "
                                                      "without it, the store's results.")] = None,
    db: Annotated[str, typer.Option("--db", help="DuckDB file (not read when TABLE is given).")] = "cic.duckdb",
    tracking_uri: TrackingOpt = None,
    experiment_prefix: Annotated[str | None, typer.Option(
        "--experiment-prefix", help="MLflow experiments '<prefix>-<dataset>' (default: the prefix of the config "
                                    "each stored run came from; for TABLE, cic)")] = None,
    report_dir: Annotated[str, typer.Option("--report-dir", help="Where each group's tables and plots are written "
                                            "before they are logged as artifacts.")] = "cic-reports",
    n_splits: Annotated[int, typer.Option("--n-splits", min=1, help="With TABLE: calibration/test splits of the "
                                          "split protocol.")] = 100,
) -> None:
    """Log to MLflow every stored result not logged yet (after a tracking-server outage, say), or a (score,
    error) table — the committed real example, say — as the pipeline would have logged it."""
    from cic.services.mlflow_results import log_store
    from cic.store.outputs import guard_output_dir

    guard_output_dir(report_dir, "--report-dir", inputs=[table])
    refuse_moved_mlflow_store(tracking_uri)
    if table is not None:
        _log_table(table, tracking_uri, experiment_prefix, report_dir, n_splits)
        return
    from cic.pipeline.run.preflight import check_store

    check_store(db, must_exist=True, option="--db")
    with without_flow(services_log_path(db)):
        stats = log_store(db, tracking=tracking_uri, experiment_prefix=experiment_prefix, report_dir=report_dir)
    console.print(f"{stats.logged} group(s) logged, {stats.already} already in MLflow", highlight=False)
    say_views(tracking_uri, stats.views)


def _log_table(table: Path, tracking_uri: str | None, experiment_prefix: str | None, report_dir: str,
               n_splits: int) -> None:
    """`cic log TABLE`: the table into a temporary store, the pipeline's calibrate and log tasks on it."""
    import tempfile

    import cic
    from cic import schema
    from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX, CalibrationConfig
    from cic.pipeline.gates.calibrate_store import calibrate_store
    from cic.pipeline.production.ingest_journal import path_digest
    from cic.pipeline.run.score_tables import store_long_table
    from cic.services.mlflow_results import TABLE_TAG, log_store, table_already_logged
    from cic.store import Store
    from cic.store.database import SCHEMA_VERSION
    from cic.store.queries import RULES_VERSION
    from cic.store.score_files import read_long_table

    frame = read_long_table(table)
    prefix = experiment_prefix or DEFAULT_EXPERIMENT_PREFIX
    key = schema.stable_hash("cic log TABLE", path_digest(table), str(n_splits), prefix, str(SCHEMA_VERSION),
                             str(RULES_VERSION), cic.__version__)
    groups = frame.select("model", "dataset", "estimator", "criterion").unique().height
    found = table_already_logged(tracking_uri, key, groups,
                                 sorted({f"{prefix}-{d}" for d in frame.get_column("dataset").unique().to_list()}))
    if found is not None:  # nothing to calibrate again: every group is a finished run
        _say_table_logged(table, found, prefix, tracking_uri)
        return
    with tempfile.TemporaryDirectory(prefix="cic-log-") as tmp:
        store_file = str(Path(tmp) / "table.duckdb")
        with Store.open(store_file) as store:
            run_keys = store_long_table(store, frame, source=f"TABLE = {str(table)!r}", digest=path_digest(table))
        calibration = CalibrationConfig(n_splits=n_splits)
        with without_flow(Path(tmp) / "services.log"):
            calibrate_store(store_file, run_keys, calibration)
            stats = log_store(store_file, tracking=tracking_uri, report_dir=report_dir, run_keys=run_keys,
                              experiment_prefix=prefix, extra_tags={TABLE_TAG: key})
    _say_table_logged(table, stats, prefix, tracking_uri)


def _say_table_logged(table: Path, stats: Any, prefix: str, tracking_uri: str | None) -> None:
    console.print(printable(f"{table}: {stats.logged} group(s) logged, {stats.already} already in MLflow "
                            f"(experiments {prefix}-<dataset>)"), highlight=False)
    say_views(tracking_uri, stats.views)


def say_views(tracking_uri: str | None, views: dict[str, str]) -> None:
    """The closing lines of a command that logged: how to open MLflow, and each experiment's α view."""
    from cic.services.mlflow_tracking import tracking_uri as resolve
    from cic.services.mlflow_view import open_lines

    for line in open_lines(resolve(tracking_uri), views):
        console.print(printable(line), soft_wrap=True, highlight=False)


@friendly_errors
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer (or abstain on).")],
    config: ConfigOpt = "demo",
    db: DbOpt = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name from the config (default: first).")] = None,
    dataset: Annotated[str, typer.Option("--dataset", help="Whose prompt and gate to use.")] = "trivia_qa",
    choices: Annotated[list[str] | None, typer.Option("--choice", help="An option (multiple choice; repeat).")] = None,
    estimator: Annotated[str, typer.Option("--estimator", help="The gate's uncertainty score.")] = "semantic_entropy",
    criterion: Annotated[str | None, typer.Option("--criterion", help="Default: the config's for the dataset, else "
                                                  "the dataset's.")] = None,
    alpha: Annotated[float | None, typer.Option("--alpha", help="The gate's risk level: its error rate among "
                                                "accepted answers is certified <= this. Default: the config's "
                                                "alpha; with several, the strictest whose gate serves.")] = None,
    bound: Annotated[str, typer.Option("--bound", help=f"The gate's bound: {bound_choices()}, or e-process for a "
                                       "gate of `recalibration.rule: anytime` (with --search anytime).")] = "cp",
    search: Annotated[str, typer.Option("--search", help="The gate's search.")] = DEFAULT_SEARCH,
    cascade: Annotated[str | None, typer.Option("--cascade", help="A cascade of the config (calibration.cascades): "
                                                "its models asked in order, the next only when needed; its "
                                                "gate's estimators and search are used.")] = None,
) -> None:
    """Answer with the live gate, or abstain; shows the uncertainty score and the certified threshold. The gate and
    its score are checked before any model loads; a gate that serves nothing abstains without one. Quiet: no
    download, conversion or weight-loading bars (TQDM_DISABLE=0 brings them back)."""
    import os

    from cic.pipeline.gates.asking import ask_question

    for quiet in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):  # read when hub / tqdm are imported: below
        os.environ.setdefault(quiet, "1")
    if alpha is not None and not 0 < alpha < 1:
        raise UserError(f"--alpha = {alpha!r}: a risk level strictly between 0 and 1")
    if cascade is not None:
        if model is not None:
            raise UserError(f"--model {model!r} with --cascade {cascade!r}: the cascade names its models")
        ask_with_cascade(question, config=config, db=db, cascade=cascade, dataset=dataset, choices=choices,
                         criterion=criterion, alpha=alpha, bound=bound)
        return
    reply = ask_question(question, config_path=config, db=db, model=model, dataset=dataset, choices=choices,
                         estimator=estimator, criterion=criterion, alpha=alpha, bound=bound, search=search, say=say_dim)
    _say_reply(reply, choices, bound, search)


def say_dim(line: str) -> None:
    """A progress line on stderr (what loads now), out of the way of the answer on stdout."""
    err_console.print(printable(line), style="dim", soft_wrap=True, highlight=False)


def _say_reply(reply: Any, choices: list[str] | None, bound: str, search: str) -> None:
    """ANSWER or ABSTAIN, the score against the threshold and the gate, and why a gate serves nothing."""
    from cic.pipeline.gates.asking import shown_answer

    verdict = ("ANSWER", "bold green") if reply.decision == "answer" else ("ABSTAIN", "bold yellow")
    answer = shown_answer(reply.answer, choices)
    console.print(styled(verdict, printable(f"  {answer!r}")) if reply.decision == "answer" else styled(verdict),
                  highlight=False)
    from cic.stats.calibration import beside

    score, threshold = beside(reply.score, reply.threshold) if None not in (reply.score, reply.threshold) else (
        "not computed (no model asked)" if reply.score is None else f"{reply.score + 0.0:.4g}",
        "none" if reply.threshold is None else f"{reply.threshold:.4g}")
    drawn = f", {reply.generations} generation(s)" if reply.generations else ""
    console.print(f"score {reply.estimator} = {score}; threshold = {threshold} "
                  f"(α = {reply.alpha:g}, {bound}, {search}, gate {reply.calibration_id[:12]}{drawn})", highlight=False)
    if reply.withheld:
        console.print(printable(f"why: {reply.withheld}"), highlight=False, soft_wrap=True)
    if reply.decision == "abstain" and reply.answer:
        console.print(printable(f"most likely answer (withheld): {answer!r}"), style="dim", highlight=False)


def ask_with_cascade(question: str, *, config: str, db: str | None, cascade: str, dataset: str,
                     choices: list[str] | None, criterion: str | None, alpha: float | None, bound: str) -> None:
    """`cic ask --cascade`: the decision, which model answered, and each stage asked (score against threshold)."""
    from cic.pipeline.gates.asking import ask_cascade, shown_answer
    from cic.stats.calibration import beside

    reply = ask_cascade(question, config_path=config, db=db, cascade=cascade, dataset=dataset, choices=choices,
                        criterion=criterion, alpha=alpha, bound=bound)
    if reply.decision == "answer":
        answer = shown_answer(reply.answer, choices)
        console.print(styled(("ANSWER", "bold green"), printable(f"  {answer!r} (answered by {reply.answered_by})")),
                      highlight=False)
    else:
        console.print(styled(("ABSTAIN", "bold yellow"), "" if reply.withheld else " (no stage within its threshold)"),
                      highlight=False)
    for model, score, threshold in reply.steps:
        console.print(printable(f"  {model}: " + ("not called (this stage never answers)" if score is None else
                                                  "score {} vs threshold {}".format(*beside(score, threshold)))),
                      highlight=False)
    if reply.not_called:
        console.print(printable(f"  not called: {', '.join(reply.not_called)} (an earlier model answered)"),
                      highlight=False)
    estimator = reply.estimators[0] if reply.estimators else "none"
    console.print(printable(f"cascade {cascade} (α = {reply.alpha:g}, {bound}, estimator {estimator}, gate "
                            f"{reply.calibration_id[:12]})"), highlight=False)
    if reply.withheld:
        console.print(printable(f"why: {reply.withheld}"), highlight=False, soft_wrap=True)
    if reply.decision == "abstain" and reply.answer:
        console.print(printable(f"last answer (withheld): {shown_answer(reply.answer, choices)!r}"), style="dim",
                      highlight=False)


COMMANDS = {"run": run, "recalibrate": recalibrate, "log": log_command, "ask": ask}
