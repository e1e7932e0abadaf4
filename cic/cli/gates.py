"""Production commands: `cic ingest` (labelled traffic in) and `cic gate list|promote|retire|export|sync`
(review candidates, put one live, hand the live gates to a serving system)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cic.cli.common import (
    ForceOpt,
    TrackingOpt,
    console,
    err_console,
    friendly_errors,
    on_store,
    printable,
    styled,
)
from cic.cli.help_format import ReadableCommand, ReadableGroup
from cic.cli.option_groups import grouped
from cic.errors import UserError
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates.gate_rows import GateRow
from cic.pipeline.run.run_results import stage_thresholds

if TYPE_CHECKING:
    from cic.pipeline.gates.lifecycle import Families

StoreOpt = Annotated[Path, typer.Option("--db", help="DuckDB file of the store.")]
PrefixOpt = Annotated[str, typer.Option("--experiment-prefix", help="MLflow experiments '<prefix>-<dataset>' of the "
                                        "gate runs (the pipeline config's default too).")]
gate_app = typer.Typer(no_args_is_help=True, cls=ReadableGroup, help="Review, promote, retire and export gates "
                                                                     "(candidate → live → retired); only a live gate "
                                                                     "is served.")


def _existing(db: Path) -> Path:
    if not db.exists():
        raise UserError(f"--db = {str(db)!r}: no such file")
    return db


@dataclass(frozen=True)
class IngestFlags:
    """How `cic ingest` reads a file (the pipeline's `IngestOptions`, as options)."""

    label_name: Annotated[str, typer.Option("--label-name", help="Criterion name for the `correct` column.")] = "human"
    criterion: Annotated[str | None, typer.Option("--criterion", help="Label the `gold` column with this criterion "
                                                  "(exact_match, token_f1[0.5], similarity[0.6]).")] = None
    relabel: Annotated[bool, typer.Option("--relabel", help="Allow labels that change stored labels (recorded in "
                                          "label_events; the gates whose window held them are flagged).")] = False
    replace: Annotated[bool, typer.Option("--replace", help="Allow re-sent records that change a stored question, "
                                          "answer, timestamp, gold or score (recorded in record_events; the gates "
                                          "whose window held them are flagged).")] = False
    max_skew: Annotated[str, typer.Option("--max-skew", help="Refuse timestamps later than now + this (clock "
                                          "skew), e.g. 5m, 1h.")] = "5m"
    timezone: Annotated[str | None, typer.Option("--timezone", help="Zone of timestamps written without one "
                                                 "(default: refuse them), e.g. UTC, Europe/Berlin.")] = None
    experiment_prefix: PrefixOpt = DEFAULT_EXPERIMENT_PREFIX
    group: Annotated[str | None, typer.Option("--group", metavar="COLUMN", help="Column holding each record's "
                                              "group (user segment, tier): the record is stored in stream "
                                              "'<stream>/<group>', so each group gets its own gates.")] = None

    def options(self) -> Any:
        """The pipeline's `IngestOptions`, its clock skew checked."""
        from cic.pipeline.production.ingest import IngestOptions

        options = IngestOptions(**asdict(self))
        options.skew("--max-skew")
        return options


@friendly_errors
@grouped
def ingest(
    file: Annotated[str | None, typer.Argument(help="Parquet, CSV or JSONL of production records (or of labels "
                                               "alone), or a Delta table (a directory with _delta_log, or an "
                                               "s3://, gs://, abfss:// URI): only what it gained since the last "
                                               "ingest is read.", metavar="FILE|TABLE")] = None,
    *,
    db: StoreOpt = Path("cic.duckdb"),
    flags: IngestFlags,
    complete: Annotated[str | None, typer.Option("--complete", metavar="ID", help="Finish an ingest cut off between "
                                                 "commits from its staged data, without its file (ID: the sha256 "
                                                 "prefix `cic recalibrate` names).")] = None,
    abandon: Annotated[str | None, typer.Option("--abandon", metavar="ID", help="Undo an ingest cut off between "
                                                "commits: remove what it stored, in one transaction.")] = None,
    tracking_uri: TrackingOpt = None,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Leave MLflow's registry alone when a relabel "
                                            "flags gates (`cic gate sync` later).")] = False,
) -> None:
    """Store production records (question, answer, scores, timestamp, correctness when known) next to the
    pipeline's runs; a file of labels alone labels them later. Idempotent; a bad record stores nothing."""
    from cic.cli.progress_view import side_progress

    given = [name for name, value in (("FILE", file), ("--complete", complete), ("--abandon", abandon)) if value]
    if len(given) != 1:
        raise UserError(f"{' and '.join(given) or 'FILE'}: give exactly one of FILE, --complete ID, --abandon ID")
    if file is None:
        with side_progress():
            _journal_command(_existing(db), complete, abandon, relabel=flags.relabel, replace=flags.replace)
        return
    parts = _ingest_file(file, db, flags.options())
    if not parts:
        console.print(printable(f"{file}: nothing new since the last ingest of this table into {db}"))
    for stats in parts:
        _say_ingested(stats.file, db, stats)
        if stats.flagged_gates and not no_mlflow:  # flagged live gates serve nothing: their aliases go too
            _sync(db, stats.flagged_gates, tracking_uri, flags.experiment_prefix)


def _ingest_file(file: str, db: Path, options: Any) -> Any:
    """Check the file (or table) and the store's place, then store its records: one `IngestStats` per part."""
    from cic.cli.progress_view import side_progress
    from cic.pipeline.production.lake_ingest import ingest_source, is_table
    from cic.pipeline.production.record_batches import SUFFIXES
    from cic.store import Store
    from cic.store.score_files import input_file

    if not is_table(file):
        input_file(file, SUFFIXES)
    elif "://" not in file and db.resolve().is_relative_to(Path(file).expanduser().resolve()):
        raise UserError(f"--db = {str(db)!r} lies inside the table {file!r}; keep the store (and what it stages) "
                        "outside the table it reads")
    if not db.parent.is_dir():
        raise UserError(f"--db = {str(db)!r}: directory {str(db.parent)!r} does not exist")
    if db.exists() and Path(file).exists() and db.resolve() == Path(file).resolve():
        raise UserError(f"FILE = {str(file)!r} is the store itself; give the records file")
    with Store.open(db, wait_s=300) as store, side_progress():
        return ingest_source(store, file, options)


def _say_ingested(file: str, db: Path, stats: Any) -> None:
    """What an ingest stored, then its notes and the stored labels or records it changed (stderr)."""
    streams = ", ".join(f"{r['model']}/{r['stream']}" for r in stats.runs)
    again = stats.records - (stats.new or 0)
    stored = (f"{stats.records} record(s) stored" if stats.new is None or stats.new == stats.records else
              f"{stats.records} record(s): {stats.new} new, {again} already stored ("
              + (f"{stats.replaced} replaced, {again - stats.replaced} unchanged)" if stats.replaced else "unchanged)"))
    console.print(printable(f"{file}: {stored}, {stats.labels} labelled"
                            + (f", {stats.unlabelled} waiting for labels" if stats.unlabelled else "")
                            + (f" ({streams})" if streams else "") + f" in {db}"))
    for note in stats.notes:
        err_console.print(styled(("warning:", "bold yellow"), " ", printable(note)), soft_wrap=True)
    for word, count, what in (("relabelled:", stats.relabelled, "stored label(s) changed (label_events)"),
                              ("replaced:", stats.replaced, "stored record(s) changed (record_events)")):
        if count:
            err_console.print(styled((word, "bold yellow"), printable(
                f" {count} {what}; "
                + (f"gates flagged: {', '.join(g[:12] for g in stats.flagged_gates)} — `cic gate list` shows why"
                   if stats.flagged_gates else "no gate's window held them"))), soft_wrap=True)


def _journal_command(db: Path, complete: str | None, abandon: str | None, *, relabel: bool, replace: bool) -> None:
    """`cic ingest --complete ID` / `--abandon ID`: finish or undo an ingest cut off between its commits."""
    from cic.pipeline.production.ingest import abandon_ingest, complete_ingest, find_ingest
    from cic.store import Store

    with Store.open(db, wait_s=300) as store:
        option, given = ("--complete", complete) if complete is not None else ("--abandon", abandon)
        row = find_ingest(store, str(given), option)  # a wrong ID is refused before the line below
        err_console.print(printable(  # the work that follows takes minutes for millions of records: say so first
            f"{'completing' if complete is not None else 'abandoning'} ingest {row['digest'][:12]} of "
            f"{row['file']} ({row['records']} record(s)): "
            + ("committing its remaining staged steps …" if complete is not None else
               "removing what it stored, in one transaction …")), soft_wrap=True)
        if complete is not None:
            stats = complete_ingest(store, complete, relabel=relabel, replace=replace)
            console.print(printable(f"ingest {complete} completed from its staged data: {stats.records} record(s), "
                                    f"{stats.labels} labelled, in {db}"))
            return
        assert abandon is not None
        done = abandon_ingest(store, abandon)
    removed = ", ".join(f"{n} {table}" for table, n in done.items() if n) or "nothing stored yet"
    console.print(printable(f"ingest {abandon} abandoned: removed {removed} in {db}"))


@gate_app.command("list", cls=ReadableCommand)
@friendly_errors
def list_gates(
    db: StoreOpt = Path("cic.duckdb"),
    state: Annotated[str | None, typer.Option("--state", help="A serving state — serving (what `cic gate export` "
                                              "serves, confirmed gates included), confirmed, withdrawn, candidate, "
                                              "unattainable, retired — or live (serving, confirmed and withdrawn "
                                              "alike).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model's gates.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="Only this dataset's (stream's) gates.")] = None,
) -> None:
    """Gates with their serving state (the words `cic gate export` uses), threshold, window and the alerts their
    recalibration raised; then the system gates (cascades, estimators chosen) with every stage's threshold; then
    why each withdrawn gate serves nothing and how to restore it."""
    from cic.pipeline.gates.serving_state import WORDS, serving_state

    choices = ("live", *WORDS)
    if state is not None and state not in choices:
        raise UserError(f"--state = {state!r}: one of {', '.join(choices)}")
    typed, typed_systems, families = _listed(db, state, model, dataset)
    _print_gates(f"gates in {db}: {len(typed)}", [_gate_cells(r) for r in typed])
    if typed_systems:
        _print_gates(f"system gates (cascades, estimators chosen) in {db}: {len(typed_systems)}",
                     _system_cells(typed_systems))
    for r in [*typed, *typed_systems]:  # what on-call needs: why it serves nothing and how to restore it
        served = serving_state(r)
        if served.word == "withdrawn":
            console.print(printable(on_store(f"{r.calibration_id[:12]} {served.line()}", db)), soft_wrap=True)
    for r in typed:
        if r.search == "anytime" and r.state == "live":
            console.print(printable(f"{r.calibration_id[:12]} ({r.model}/{r.dataset} {r.estimator} "
                                    f"α={r.alpha:g}): certified at every night since {_since(r)}"), soft_wrap=True)
    _print_label_assumptions([*typed, *typed_systems])
    by_key = sorted(typed, key=lambda r: (r.model, r.dataset, _when(r.created_at)))
    for r in [*by_key, *sorted(typed_systems, key=lambda r: (r.system, r.dataset, _when(r.created_at)))]:
        for alert in r.alerts:
            console.print(printable(f"{r.calibration_id[:12]} alert: {alert}"), soft_wrap=True)
    shown = {r.model for r in typed}
    _warn_over_budget({key: family for key, family in families.items() if family[0].model in shown})


def _print_label_assumptions(rows: Sequence[GateRow]) -> None:
    """The label assumption of every gate listed: one line for those that count missing labels as errors, one
    per gate that assumes labels go missing at random (a weaker guarantee, said where on-call reads it)."""
    from cic.pipeline.run.missing_labels import ASSUMPTIONS, WORST_CASE, gate_assumption

    words = {r.calibration_id: gate_assumption(r) for r in rows}
    safe = [gid for gid, said in words.items() if said == ASSUMPTIONS[WORST_CASE]]
    if safe:
        console.print(printable(f"labels: {len(safe)} gate(s): {ASSUMPTIONS[WORST_CASE]}"))  # wrapped to the width
    for r in rows:
        if words[r.calibration_id] != ASSUMPTIONS[WORST_CASE]:
            console.print(printable(f"{r.calibration_id[:12]} labels: {words[r.calibration_id]}"))


def _when(moment: Any) -> tuple[bool, Any]:
    """A sort key for a timestamp that may be missing (missing first, as the store sorts them)."""
    return moment is not None, moment or 0


def _listed(db: Path, state: str | None, model: str | None, dataset: str | None) -> tuple[list[GateRow],
                                                                                          list[GateRow], Any]:
    """The gates and system gates `cic gate list` shows (in that state, of that model and dataset), and the live
    families (for the over-budget warning)."""
    import polars as pl

    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.lifecycle import gates, live_families
    from cic.pipeline.gates.system_gates import system_gates
    from cic.store import Store

    filters = {k: v for k, v in (("model", model), ("dataset", dataset)) if v is not None}
    with Store.open(_existing(db), read_only=True, wait_s=60) as store:
        rows = gates(store, **filters)
        families = live_families(store)
        systems = system_gates(store, **({"dataset": dataset} if dataset else {}))
    if model is not None:
        systems = systems.filter(pl.col("models").list.contains(model))
    typed = [r for r in gate_rows(rows.sort("model", "dataset", "estimator", "criterion", "alpha", "bound", "search",
                                            "created_at")) if _in_state(r, state)]
    typed_systems = [r for r in gate_rows(systems.sort("system", "dataset", "criterion", "alpha", "bound",
                                                       "created_at")) if _in_state(r, state)]
    return typed, typed_systems, families


def _in_state(row: Any, state: str | None) -> bool:
    """Whether a gate is in `--state`: a serving state (serving takes confirmed too), or the stored state live."""
    from cic.pipeline.gates.serving_state import serving_state

    if state is None:
        return True
    if state == "live":
        return row.state == "live"
    served = serving_state(row)
    return served.serves if state == "serving" else served.word == state


def _gate_cells(r: GateRow) -> tuple[str, ...]:
    """A gate in the gate list's columns (its state in the serving words every surface uses)."""
    from cic.pipeline.gates.serving_state import serving_state

    kind = "" if (r.kind or "pipeline") == "pipeline" else f" ({r.kind})"
    return tuple(map(printable, (
        r.calibration_id[:12], serving_state(r).word + kind,
        f"{r.model} · {r.dataset}", f"{r.estimator} · {r.criterion}", f"{r.alpha:g} · {_delta(r)}",
        f"{r.bound} · {r.search}", "unattainable" if r.threshold is None else f"{r.threshold:.4g}",
        str(r.n_cal), _window_cell(r), _alert_summary(list(r.alerts)))))


def _since(row: GateRow) -> str:
    from cic.pipeline.gates.anytime_gates import certified_since

    return certified_since(row)[:19]


def _window_cell(row: GateRow) -> str:
    """A gate's window end, or for an anytime gate since when it is certified at every night."""
    from cic.pipeline.gates.anytime_gates import certified_since, is_anytime

    if is_anytime(row):
        return f"since {certified_since(row)[:10]}"
    return str(row.window_to or "—")[:19]


def _system_cells(rows: list[GateRow]) -> list[tuple[str, ...]]:
    """System gates in the gate list's columns: the system's name and models in order, each stage's threshold
    ("never": that model never answers)."""
    from cic.pipeline.gates.serving_state import serving_state

    return [tuple(map(printable, (
        r.calibration_id[:12], f"{serving_state(r).word} (system)",
        f"{r.system}: {' -> '.join(r.models)} · {r.dataset}",
        f"{(r.estimators or [r.estimator_rule])[0]} · {r.criterion}", f"{r.alpha:g} · {r.delta:g}",
        f"{r.bound} · {r.search}", stage_thresholds(r.thresholds)
        if r.certified else "unattainable", str(r.n_cal), "—", _alert_summary(list(r.alerts)))))
        for r in rows]


def _warn_over_budget(families: Families) -> None:
    """Say where live gates of one model and configuration spent more than their delta together."""
    from cic.pipeline.gates.lifecycle import over_budget

    for line in over_budget(families):
        err_console.print(styled(("over budget:", "bold yellow"), " ", printable(line)), soft_wrap=True)


GATE_COLUMNS = ("id", "state", "model · dataset", "estimator · criterion", "α · δ", "bound · search", "threshold",
                "n", "window to", "alerts")


def _print_gates(title: str, cells: list[tuple[str, ...]]) -> None:
    """The gates under GATE_COLUMNS, fitted to the console (a block per gate where a table would break words)."""
    from cic.cli.fitted_table import plain_table

    console.print(plain_table(title, GATE_COLUMNS, cells))


def _delta(row: GateRow) -> str:
    """The δ column: the gate's own, or `δ/G` for one of G datasets certified at once (each at δ / G)."""
    together = row.groups or 1
    return f"{row.delta:g}" if together == 1 else f"{row.delta:g}/{together}"


def _alert_summary(alerts: list[str]) -> str:
    """The alerts column: how many, of which kinds (the full texts follow the table)."""
    from cic.pipeline.alerts import counts_by_kind

    if not alerts:
        return "—"
    return ", ".join(f"{kind}" + (f" ×{n}" if n > 1 else "") for kind, n in counts_by_kind(alerts))


SYNC_HINT = "run `cic gate sync` when MLflow is back (it reconciles every key's `live` alias with the store)"


def _sync(db: Path, gate_ids: list[str], tracking_uri: str | None, experiment_prefix: str) -> None:
    """Bring MLflow's registry in line for these gates' keys; an outage is reported, never fatal: the store holds
    the new state and `cic gate sync` catches up."""
    from cic.services.mlflow_tracking import tracking_uri as resolve
    from cic.services.registry_sync import registry_sync

    uri = resolve(tracking_uri)
    try:
        names = registry_sync(str(db), uri, gate_ids, experiment_prefix=experiment_prefix)
    except Exception as exc:  # the store already holds the new state
        err_console.print(styled(("MLflow registry not updated:", "bold yellow"), f" {type(exc).__name__}: "
                                 f"{printable(str(exc))} — the store holds the new state; {SYNC_HINT}"))
        return
    for name in names[:SHOWN_NAMES]:
        console.print(printable(f"MLflow registry ({uri}): models:/{name}"), soft_wrap=True, highlight=False)


SHOWN_NAMES = 10


@gate_app.command("promote", cls=ReadableCommand)
@friendly_errors
def promote_gate(
    gate_id: Annotated[str, typer.Argument(help="Gate id (or its first 12 characters, as `cic gate list` shows).")],
    db: StoreOpt = Path("cic.duckdb"),
    despite_alerts: Annotated[bool, typer.Option("--despite-alerts", help="Promote a candidate whose recalibration "
                                                 "raised alerts (after you reviewed them).")] = False,
    reason: Annotated[str, typer.Option("--reason", help="Recorded with the change.")] = "promoted by hand",
    tracking_uri: TrackingOpt = None,
    experiment_prefix: PrefixOpt = DEFAULT_EXPERIMENT_PREFIX,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Leave MLflow's registry alone.")] = False,
    without_guarantee: Annotated[bool, typer.Option("--without-guarantee", help="Serve a gate whose search has no "
                                                    "high-probability guarantee (paper); recorded, and the export "
                                                    "says so.")] = False,
) -> None:
    """Make a gate live — a model's, or a system's (a cascade, an estimator chosen) — retiring the live gate of its
    key, and point MLflow's `live` alias at it."""
    from cic.pipeline.gates.lifecycle import family_of, live_families, promote
    from cic.store import Store

    with Store.open(_existing(db), wait_s=300) as store:
        row, retired = promote(store, gate_id, reason=reason, despite_alerts=despite_alerts,
                               without_guarantee=without_guarantee)
        key = None if row.is_system else family_of(row)  # a system spends its own delta
        family = {} if key is None else {key: live_families(store).get(key, [])}
    console.print(printable(f"{_described(row)}" + (f"; retired {', '.join(r[:12] for r in retired)}"
                                                     if retired else "")))
    _warn_over_budget(family)
    if not no_mlflow:
        _sync(db, [row.calibration_id, *retired], tracking_uri, experiment_prefix)


def _described(row: GateRow) -> str:
    """A promoted gate in one line: which key it speaks for and what it serves."""
    if row.is_system:
        return (f"system gate {row.calibration_id[:12]} is {row.state}: {row.system} ({' -> '.join(row.models)}) on "
                f"{row.dataset} × {row.criterion} α={row.alpha:g} {row.bound} {row.search}, thresholds "
                f"{stage_thresholds(row.thresholds) if row.certified else 'unattainable'}")
    return (f"gate {row.calibration_id[:12]} is {row.state}: {row.model}/{row.dataset} {row.estimator} × "
            f"{row.criterion} α={row.alpha:g} {row.bound} {row.search}, threshold "
            f"{'unattainable' if row.threshold is None else format(row.threshold, '.4g')}")


@gate_app.command("confirm", cls=ReadableCommand)
@friendly_errors
def confirm_gate(
    gate_id: Annotated[str, typer.Argument(help="Id of a flagged live gate (or its first 12 characters).")],
    db: StoreOpt = Path("cic.duckdb"),
    reason: Annotated[str, typer.Option("--reason", help="Who confirms it and why (kept in the gate's event "
                                        "log).")] = "confirmed by hand after review",
    tracking_uri: TrackingOpt = None,
    experiment_prefix: PrefixOpt = DEFAULT_EXPERIMENT_PREFIX,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Leave MLflow's registry alone (`cic gate sync` "
                                            "later).")] = False,
) -> None:
    """Keep serving a flagged live gate after review: recorded in its event log; `cic gate export`, `cic ask` and
    MLflow's alias serve it again. (A newer gate promoted for its key clears the flag too.)"""
    from cic.pipeline.gates.lifecycle import confirm
    from cic.store import Store

    with Store.open(_existing(db), wait_s=300) as store:
        row = confirm(store, gate_id, reason=reason)
    console.print(f"gate {row['calibration_id'][:12]} confirmed: it is served again by `cic gate export`")
    if not no_mlflow:
        _sync(db, [row["calibration_id"]], tracking_uri, experiment_prefix)


@gate_app.command("retire", cls=ReadableCommand)
@friendly_errors
def retire_gate(
    gate_id: Annotated[str, typer.Argument(help="Gate id (or its first 12 characters).")],
    db: StoreOpt = Path("cic.duckdb"),
    reason: Annotated[str, typer.Option("--reason", help="Why, in words (kept in the gate's event log).")] = \
        "retired by hand",
    tracking_uri: TrackingOpt = None,
    experiment_prefix: PrefixOpt = DEFAULT_EXPERIMENT_PREFIX,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Leave MLflow's registry alone (`cic gate sync` "
                                            "later).")] = False,
) -> None:
    """Take a gate out of service; its key serves nothing until another is promoted."""
    from cic.pipeline.gates.lifecycle import retire
    from cic.store import Store

    with Store.open(_existing(db), wait_s=300) as store:
        row = retire(store, gate_id, reason=reason)
    console.print(f"gate {row.calibration_id[:12]} is retired")
    if not no_mlflow:
        _sync(db, [row.calibration_id], tracking_uri, experiment_prefix)


@gate_app.command("export", cls=ReadableCommand)
@friendly_errors
def export_gates(
    out: Annotated[Path, typer.Option("--out", help="JSON file of the live gates.")],
    db: StoreOpt = Path("cic.duckdb"),
    model: Annotated[str | None, typer.Option("--model", help="Only this model's gates.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="Only this dataset's (stream's) gates.")] = None,
    force: ForceOpt = False,
) -> None:
    """Write what a serving system should serve, one JSON list: every live gate (verified against its
    certificate), and for a key whose gates were all retired, whose gate is unattainable or without a guarantee,
    or whose live gate is flagged (until it is recalibrated or confirmed with `cic gate confirm`), an entry that
    serves nothing (abstain on all) and says why; then each system's newest gate (a cascade or a model's estimator
    chosen, re-certified from the store) with every stage's threshold."""
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.gates.serving import served_entries, waiting_advice
    from cic.store import Store
    from cic.store.outputs import guard_output, write_text

    target = guard_output(out, "--out", inputs=[db], force=force, writes="json")
    filters = {k: v for k, v in (("model", model), ("dataset", dataset)) if v is not None}
    with Store.open(_existing(db), read_only=True, wait_s=60) as store:
        exported = served_entries(store, **filters)
        waiting = None if exported else waiting_advice(store, gates(store, **filters).filter(state="candidate"))
    if not exported:
        raise UserError(f"no live or retired gate in {db}" + (f" for {filters}" if filters else "") + "; " + (
            waiting or "no candidate waits either (cic run and cic recalibrate write them)"))
    write_text(target, json.dumps(exported, indent=2) + "\n", "--out")
    _say_exported(exported, target)


def _say_exported(exported: list[dict[str, Any]], target: Path) -> None:
    """How many gates serve and how many keys serve nothing (and why), then each withdrawn one (stderr)."""
    systems = [e for e in exported if "system" in e]
    singles = [e for e in exported if "system" not in e]
    live = sum(e["serve"] == "gate" for e in exported)
    serving_systems = sum(e["serve"] == "system" for e in systems)
    why = {"every gate retired": "retired_gate_id", "alpha unattainable": "unattainable_gate_id",
           "no guarantee": "unguaranteed_gate_id", "withdrawn": "flagged_gate_id"}
    nothing = ", ".join(f"{n} {label}" for label, field in why.items()
                        if (n := sum(e.get(field) is not None for e in singles)))
    systems_said = (f"; {serving_systems} system gate(s) (cascades, estimators chosen)"
                    + (f", {len(systems) - serving_systems} serving nothing" if len(systems) > serving_systems
                       else "") if systems else "")
    console.print(f"{live} gate(s) serving" + (f" and {len(singles) - live} key(s) serving nothing "
                                            f"({nothing})" if nothing else "") + systems_said + f" written to {target}")
    for entry in exported:
        if entry.get("flagged"):
            err_console.print(styled(("withdrawn, serving nothing:", "bold yellow"), " ", printable(entry["reason"])),
                              soft_wrap=True)


@gate_app.command("sync", cls=ReadableCommand)
@friendly_errors
def sync_registry(
    db: StoreOpt = Path("cic.duckdb"),
    tracking_uri: TrackingOpt = None,
    experiment_prefix: PrefixOpt = DEFAULT_EXPERIMENT_PREFIX,
) -> None:
    """Reconcile MLflow's registry with the store, both ways: every live or retired gate registered, `live` set
    where a gate is live and removed where none is. One line and exit 2 when MLflow does not answer; exit 1 when
    it answers with a failure."""
    from cic.cli.runner import without_flow
    from cic.cli.service_logs import services_log_path
    from cic.pipeline.run import progress
    from cic.services.mlflow_tracking import tracking_uri as resolve
    from cic.services.registry_sync import registry_sync

    _existing(db)
    uri = resolve(tracking_uri)
    refused: dict[str, str] = {}
    try:
        with without_flow(services_log_path(db)):
            names = registry_sync(str(db), uri, None, experiment_prefix=experiment_prefix, refused=refused,
                                  progress=lambda done, total: progress.report("registry", done, total))
    except UserError:
        raise
    except Exception as exc:
        err_console.print(styled(("MLflow registry not synced:", "bold red"), f" {type(exc).__name__}: "
                                 f"{printable(str(exc))}"), soft_wrap=True)
        raise typer.Exit(1) from None
    models = sorted({name.split("@")[0] for name in names})
    console.print(printable(f"MLflow registry ({uri}): {len(names)} serving gate(s) in {len(models)} registered "
                            "model(s); gates that serve nothing (α unattainable) are not registered"),
                  soft_wrap=True, highlight=False)
    for gate_id, why in refused.items():  # re-certified first: a gate the store no longer certifies gets no alias
        err_console.print(styled(("withdrawn in the registry:", "bold yellow"), " ",
                                 printable(f"gate {gate_id[:12]}: {why}")), soft_wrap=True)
    for name in names[:SHOWN_NAMES]:
        console.print(printable(f"  models:/{name}"), soft_wrap=True, highlight=False)
    if len(names) > SHOWN_NAMES:
        console.print(f"  … and {len(names) - SHOWN_NAMES} more (`cic gate list --state live`)", highlight=False)


COMMANDS = {"ingest": ingest}
GROUPS = {"gate": gate_app}
