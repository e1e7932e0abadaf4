"""Statistics commands on precomputed (score, error) tables: calibrate and evaluate (the studies of searches and
bounds — simulate, report, bench, validity — are in `cic.cli.studies`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from cic.cli.common import (
    BoundOpt,
    Delta,
    ForceOpt,
    Search,
    console,
    fmt,
    friendly_errors,
    load_pairs,
    parse_floats,
    parse_names,
    printable,
)
from cic.cli.option_groups import Columns, Grid, Judged, Splits, StoredRun, grouped
from cic.errors import UserError
from cic.stats.searches import DEFAULT_SEARCH

MinCoverageOpt = Annotated[float | None, typer.Option("--min-coverage", help="Refuse a gate (abstain on everything) "
                                                   "unless it answers at least this share of questions with "
                                                   "probability >= 1 - delta (one table's gate).")]
PooledFallbackOpt = Annotated[bool, typer.Option("--pooled-fallback", help="With --group: serve a group too small to "
                                                 "certify the pooled gate (no per-group guarantee).")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the search's whole guarantee statement (by default "
                                         "one line: the score and what the search guarantees).")]


@friendly_errors
@grouped
def calibrate(
    file: Annotated[Path, typer.Argument(help="Parquet, CSV or JSON-lines table of calibration items; a long table, an "
                                              "evaluation output (lm-eval, inspect-ai, HELM) or a pipeline DuckDB "
                                              "file: one group of it (--model/--dataset/--estimator/--criterion).")],
    *,
    alpha: Annotated[float, typer.Option("--alpha", help="Target error rate among accepted answers.")],
    columns: Columns,
    delta: Delta = 0.05,
    bound: BoundOpt = "cp",
    search: Search = DEFAULT_SEARCH,
    where: Grid,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")] = None,
    gate_out: Annotated[Path | None, typer.Option("--gate", help="Write the serving gate JSON here.")] = None,
    show_table: Annotated[bool, typer.Option("--table", help="Print every candidate threshold.")] = False,
    explain: ExplainOpt = False,
    stored: StoredRun,
    group_col: Annotated[str | None, typer.Option("--group", help="One threshold per value of this column, all "
                                                  "certified at once (each group at delta / G).")] = None,
    pooled_fallback: PooledFallbackOpt = False,
    force: ForceOpt = False,
    cascade: Annotated[str | None, typer.Option("--cascade", help="Models in cost order, comma-separated (a long "
                                                "table): certify the cascade's system error at once.")] = None,
    min_coverage: MinCoverageOpt = None,
    judged: Judged,
) -> None:
    """Certify the largest threshold whose error rate among accepted answers is <= ALPHA (per group with --group;
    a cascade with --cascade; one estimator chosen with --estimator auto; a judge corrected by people: --judge-col)."""
    json_out, gate_out = _json_outputs(json_out, gate_out, inputs=[file, where.pilot], force=force)
    settings = {"alpha": alpha, "delta": delta, "bound": bound, "search": search}
    judged.check(**{"--group": group_col, "--cascade": cascade, "--estimator auto": stored.estimator == "auto"})
    if cascade is not None or stored.estimator == "auto":
        _refuse_unused(gate_out, group_col, where, stored, show_table, min_coverage)
        _calibrate_system(file, cascade, stored, json_out=json_out, **settings)
    elif group_col is not None:
        _calibrate_groups(file, group_col, columns, grid=where.points(columns.score_col), n_min=where.n_min,
                          start=where.start, pooled_fallback=pooled_fallback, json_out=json_out, gate_out=gate_out,
                          min_coverage=min_coverage, **settings)
    else:
        _calibrate_one(file, columns, stored, where, {**settings, "min_coverage": min_coverage}, json_out=json_out,
                       gate_out=gate_out, show_table=show_table, explain=explain, judged=judged)


def _calibrate_judged(file: Path, score_col: str, judged: Judged, stored: StoredRun, settings: dict[str, Any], *,
                      json_out: Path | None, gate_out: Path | None, explain: bool, n_min: int | None) -> None:
    """One threshold certified from a judge's labels corrected by people's (`cic.calibrate_judged`): the result, the
    people-only result for comparison, the guarantee with its label assumption, and --json / --gate as asked."""
    from cic.cli.common import load_stored_judged
    from cic.stats.calibration import calibrate, calibrate_judged
    from cic.store.outputs import write_text
    from cic.store.score_files import judged_columns

    scores, judge, human, ids = (load_stored_judged(file, stored.filters(), judged.judge_col, judged.human_col)
                                 if file.suffix == ".duckdb" else
                                 judged_columns(file, score_col, judged.judge_col, judged.human_col, stored.filters()))
    settings = {k: v for k, v in settings.items() if k != "bound"}
    result = calibrate_judged(scores, judge, human, n_min=n_min, ids=ids, **settings)
    console.print(result.summary(), highlight=False)
    people = ~np.isnan(human)
    alone = calibrate(scores[people], human[people].astype(int), **settings)
    console.print(f"people's labels alone ({int(people.sum())}): answer {alone.n_accepted / people.sum():.3f} of "
                  f"their questions" if alone.feasible else f"people's labels alone ({int(people.sum())}): "
                  f"alpha = {alone.alpha:g} unattainable", highlight=False)
    console.print(printable(guarantee_line(result.guarantee, stored.estimator, explain, coverage=result)), style="dim",
                  highlight=False)
    if json_out is not None:
        write_text(json_out, result.to_json() + "\n", "--json")
        console.print(f"result written to {json_out}", style="dim")
    if gate_out is not None:
        write_text(gate_out, result.gate().to_json() + "\n", "--gate")
        console.print(f"gate written to {gate_out}", style="dim")


def _json_outputs(json_out: Path | None, gate_out: Path | None, *, inputs: list[Path | None],
                  force: bool) -> tuple[Path | None, Path | None]:
    """--json and --gate checked before any work: never an input, a device or each other."""
    from cic.store.outputs import guard_output

    if json_out is not None:
        json_out = guard_output(json_out, "--json", inputs=inputs, force=force, writes="json")
    if gate_out is not None:
        gate_out = guard_output(gate_out, "--gate", inputs=inputs, force=force, writes="json",
                                others={"--json": json_out})
    return json_out, gate_out


def _refuse_unused(gate_out: Path | None, group_col: str | None, where: Grid, stored: StoredRun,
                   show_table: bool, min_coverage: float | None) -> None:
    """--cascade / --estimator auto take a score table and write --json only: name every option that would be
    ignored."""
    unused = {"--gate": gate_out, "--group": group_col, "--grid": where.grid, "--pilot": where.pilot,
              "--n-min": where.n_min, "--start": where.start, "--run-key": stored.run_key,
              "--table": show_table or None, "--min-coverage": min_coverage}
    given = [name for name, value in unused.items() if value is not None]
    if given:
        raise UserError(f"{', '.join(given)} do not apply with --cascade / --estimator auto (a system of "
                        "thresholds on a score table; --json writes its result)")


def _calibrate_one(file: Path, columns: Columns, stored: StoredRun, where: Grid, settings: dict[str, Any], *,
                   json_out: Path | None, gate_out: Path | None, show_table: bool, explain: bool = False,
                   judged: Judged | None = None) -> None:
    """One threshold for one table: the result, its guarantee (one line naming the score; whole with --explain),
    and --json / --gate / --table as asked (from a judge corrected by people with `judged`)."""
    from cic.stats.calibration import calibrate as run_calibration
    from cic.store.outputs import write_text

    if judged is not None and judged.check(**{"--grid": where.grid, "--pilot": where.pilot, "--start": where.start,
                                              "--table": show_table, "--bound": settings["bound"] != "cp"}):
        return _calibrate_judged(file, columns.score_col, judged, stored, settings, json_out=json_out,
                                 gate_out=gate_out, explain=explain, n_min=where.n_min)

    chosen: dict[str, str] = {}
    scores, errors = load_pairs(file, columns.score_col, columns.error_col, columns.correct_col, stored.filters(),
                                chosen=chosen)
    grid = where.points(columns.score_col)
    result = run_calibration(scores, errors, grid=grid, n_min=where.n_min, start=where.start, **settings)
    console.print(result.summary(), highlight=False)
    unrefused = result if not result.refused else run_calibration(
        scores, errors, grid=grid, n_min=where.n_min, start=where.start, **{**settings, "min_coverage": None})
    console.print(_limits_line(scores, errors, unrefused, plain=grid is None and where.n_min is None
                               and where.start is None), highlight=False)
    console.print(printable(guarantee_line(result.guarantee, chosen.get("estimator"), explain,
                                           coverage=result)), style="dim", highlight=False)
    if show_table:
        console.print(result.table())
    if json_out is not None:
        write_text(json_out, result.to_json(include_table=show_table) + "\n", "--json")
        console.print(f"result written to {json_out}", style="dim")
    if gate_out is not None:
        write_text(gate_out, result.gate().to_json() + "\n", "--gate")
        console.print(f"gate written to {gate_out}", style="dim")


def _limits_line(scores: Any, errors: Any, result: Any, *, plain: bool) -> str:
    """Why the gate answers what it does (`cic.stats.limits`): certified against the score's limit and any rule's
    ceiling, and for an unattainable alpha whether labels (about how many) or the score stand in the way. The
    label estimate runs the same search unless a grid or a first test was given (then the default)."""
    from cic.stats.limits import coverage_limits
    from cic.stats.searches import DEFAULT_SEARCH

    certified = result.n_accepted / result.n_calibration if result.n_calibration else 0.0
    limits = coverage_limits(scores, errors, alpha=result.alpha, certified=certified, delta=result.delta,
                             bound=result.bound, search=result.search if plain else DEFAULT_SEARCH, draws=100)
    return f"limits: {limits.sentence()}"


def _group_table(file: Path, group_col: str, columns: Columns) -> tuple[Any, Any, Any]:
    """(scores, errors, group labels) of a Parquet/CSV table with a group column."""
    from cic.store.score_files import read_table, score_error_arrays

    if file.suffix == ".duckdb":
        raise UserError(f"--group = {group_col!r}: give a Parquet, CSV or JSON-lines table holding that column "
                         "(per-group calibration of a stored run is not supported yet)")
    frame = read_table(file)
    if group_col not in frame.columns:
        raise UserError(f"--group = {group_col!r}: no such column in {str(file)!r}; columns are "
                         f"{', '.join(frame.columns)}")
    labels = frame.get_column(group_col)
    if labels.null_count():
        raise UserError(f"--group = {group_col!r}: missing value at row {int(labels.is_null().arg_true()[0])} of "
                         f"{str(file)!r}")
    scores, errors = score_error_arrays(frame, one_group=True, score_col=columns.score_col,
                                        error_col=columns.error_col, correct_col=columns.correct_col,
                                        source=repr(str(file)))
    return scores, errors, labels.cast(str).to_numpy()


def _evaluate_groups(file: Path, group_col: str, columns: Columns, splits: Splits, where: Grid, out: Path | None, *,
                     force: bool = False) -> None:
    """`cic evaluate --group COL`: the per-group FDR / coverage table, per-group gates beside the pooled gate."""
    import polars as pl

    from cic.stats.groups import evaluate_group_splits
    from cic.store.outputs import write_frame

    scores, errors, labels = _group_table(file, group_col, columns)
    settings = {"delta": splits.delta, "n_splits": splits.n_splits, "cal_fraction": splits.cal_fraction,
                "seed": splits.seed, "n_min": where.n_min, "start": where.start}
    rows = []
    for bound in parse_names(splits.bounds):
        for name in parse_names(splits.search):
            rows += [{**r, "bound": bound, "search": name} for r in evaluate_group_splits(
                scores, errors, labels, alphas=tuple(parse_floats(splits.alphas, "--alphas")), bound=bound,
                search=name, **{k: v for k, v in settings.items() if v is not None})]
    table = Table(title=f"{file.name}: per group ({group_col}), {splits.n_splits} splits, delta "
                        f"{splits.delta:g} (per-group gates at delta / G)")
    for column in ("α", "bound", "search", "group", "size", "gate", "FDR mean", "test FDR > α", "coverage",
                   "fails"):
        table.add_column(column, justify="left" if column in ("bound", "search", "group", "gate") else "right")
    for r in rows:
        table.add_row(f"{r['alpha']:g}", r["bound"], r["search"], printable(r["group"]), str(r["size"]),
                      "per group" if r["gate"] == "per_group" else "pooled", fmt(r["fdr_mean"]),
                      fmt(r["fdr_above_alpha"], ".2f"), fmt(r["coverage_mean"]), f"{r['fails']}/{r['n_splits']}")
    console.print(table)
    if out is not None:
        write_frame(pl.DataFrame(rows), out, "--out", force=force)
        console.print(f"table written to {out}", style="dim")


def _calibrate_system(file: Path, cascade: str | None, stored: StoredRun, **kwargs: Any) -> None:
    """--cascade or --estimator auto (not both: a cascade names each model's estimator)."""
    from cic.cli.system_gates import run_cascade, run_estimator_choice

    filters = {k: v for k, v in stored.filters().items() if k != "run_key"}

    if cascade is not None and filters["estimator"] == "auto":
        raise UserError("--cascade with --estimator auto: name the one estimator the models use (--estimator NAME)")
    if cascade is not None:
        run_cascade(file, cascade, filters, **kwargs)
    else:
        run_estimator_choice(file, {**filters, "estimator": None}, **kwargs)


def _calibrate_groups(file: Path, group_col: str, columns: Columns, *, pooled_fallback: bool, json_out: Path | None,
                      gate_out: Path | None, min_coverage: float | None, **settings: Any) -> None:
    """`cic calibrate --group COL`: per-group gates with a simultaneous guarantee, their table, JSON and gates."""
    import json

    if min_coverage is not None:
        raise UserError(f"--min-coverage {min_coverage:g}: applies to one table's gate, not with --group")

    from cic.stats.gate import Gate
    from cic.stats.groups import calibrate_groups
    from cic.store.outputs import write_text

    scores, errors, labels = _group_table(file, group_col, columns)
    fitted = calibrate_groups(scores, errors, labels, pooled_fallback=pooled_fallback,
                              **{k: v for k, v in settings.items() if v is not None})
    table = Table(title=f"{file.name}: {len(fitted.groups)} groups, alpha {fitted.alpha:g}, delta {fitted.delta:g} "
                        f"(each group at {fitted.delta / len(fitted.groups):.3g})")
    for column in ("group", "size", "threshold", "served", "accepted", "errors", "UCB"):
        table.add_column(column, justify="left" if column in ("group", "served") else "right")
    for row in fitted.as_rows():
        served = {"group": "its own certificate", "pooled": "pooled gate (no per-group guarantee)",
                  "none": "nothing: alpha unattainable for this group"}[row["served"]]
        table.add_row(printable(row["group"]), str(row["size"]), fmt(row["threshold"], ".4g"), served,
                      str(row["n_accepted"]), str(row["n_errors"]), fmt(row["bound_value"], ".4f"))
    console.print(table)
    console.print(f"pooled gate (all groups, average guarantee only): threshold {fmt(fitted.pooled.threshold, '.4g')}",
                  highlight=False)
    console.print(f"guarantee: {fitted.guarantee}", style="dim", highlight=False)
    document = {"kind": "cic.group_calibration", "alpha": fitted.alpha, "delta": fitted.delta,
                "guarantee": fitted.guarantee, "groups": fitted.as_rows(), "pooled_threshold": fitted.pooled.threshold}
    if json_out is not None:
        write_text(json_out, json.dumps(document, indent=2) + "\n", "--json")
        console.print(f"result written to {json_out}", style="dim")
    if gate_out is not None:
        gates = {row["group"]: json.loads(Gate(row["threshold"], {"group": row["group"], "served": row["served"],
                                                                  "alpha": fitted.alpha, "delta": fitted.delta})
                                          .to_json()) for row in fitted.as_rows()}
        write_text(gate_out, json.dumps({"kind": "cic.group_gates", "guarantee": fitted.guarantee, "groups": gates,
                                         "other_groups": json.loads(Gate(fitted.pooled.threshold, {
                                             "served": "pooled (no per-group guarantee)"}).to_json())}, indent=2)
                   + "\n", "--gate")
        console.print(f"gates written to {gate_out}", style="dim")


@friendly_errors
@grouped
def evaluate(
    file: Annotated[Path, typer.Argument(help="Parquet, CSV or JSON-lines table of labelled items; a long table, an "
                                              "evaluation output (lm-eval, inspect-ai, HELM) or a pipeline DuckDB "
                                              "file: one group of it (--model/--dataset/--estimator/--criterion).")],
    *,
    columns: Columns,
    splits: Splits,
    where: Grid,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the table (.csv or .parquet).")] = None,
    stored: StoredRun,
    group_col: Annotated[str | None, typer.Option("--group", help="Per-group table: per-group gates (each at "
                                                  "delta / G) and the pooled gate judged on each group.")] = None,
    force: ForceOpt = False,
) -> None:
    """The paper's protocol: FDR, coverage and fails over repeated calibration/test splits (per group with
    --group)."""
    from cic.cli.progress_view import side_progress
    from cic.pipeline.run.progress import report
    from cic.stats.protocol import evaluate_splits
    from cic.store.outputs import write_frame

    out = _frame_out(out, [file, where.pilot], force)
    if group_col is not None:
        _evaluate_groups(file, group_col, columns, splits, where, out, force=force)
        return
    scores, errors = load_pairs(file, columns.score_col, columns.error_col, columns.correct_col, stored.filters())
    with side_progress():  # 10^7 rows take seconds to a minute: a line on stderr while it works
        frame = evaluate_splits(scores, errors, alphas=parse_floats(splits.alphas, "--alphas"),
                                bounds=parse_names(splits.bounds), search=parse_names(splits.search),
                                delta=splits.delta, n_splits=splits.n_splits, cal_fraction=splits.cal_fraction,
                                seed=splits.seed, grid=where.points(columns.score_col), n_min=where.n_min,
                                start=where.start, progress=lambda done, total: report(f"evaluate {file.name}", done,
                                                                                       total))
    console.print(_splits_table(file.name, splits, frame))
    for line in _never_certified(frame):
        console.print(line, highlight=False)
    if out is not None:
        write_frame(frame, out, "--out", force=force)
        console.print(f"table written to {out}", style="dim")


def _frame_out(out: Path | None, inputs: list[Path | None], force: bool) -> Path | None:
    """--out of a table: a .csv or .parquet name, checked before any work."""
    from cic.store.outputs import guard_output

    if out is None:
        return None
    if out.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise UserError(f"--out = {str(out)!r}: use a .csv or .parquet file name")
    return guard_output(out, "--out", inputs=inputs, force=force, writes="frame")


def _splits_table(name: str, splits: Splits, frame: Any) -> Table:
    """The protocol's results, one row per (alpha, bound, search), with the two limits the protocol's table carries
    beside the coverage: the most a threshold on this score covers in-sample, any rule's ceiling."""
    from cic.reports.tables import mean_std
    from cic.stats.searches import get_search

    table = Table(title=f"{name}: {splits.n_splits} splits, cal_fraction {splits.cal_fraction:g}, delta "
                        f"{splits.delta:g}, base error rate {frame['base_error_rate'][0]:.3f}")
    for col in ("alpha", "bound", "search", "guarantee", "FDR (mean ± std)", "test FDR > α", "coverage", "correct cov.",
                "fails", "threshold", "limit", "ceiling"):
        table.add_column(col, justify="right" if col not in ("bound", "search", "guarantee") else "left")
    table.caption = ("limit: the most a threshold on this score covers at error <= alpha in-sample; ceiling: any "
                     "rule's, (1 - base error) / (1 - alpha)")
    for row in frame.iter_rows(named=True):
        table.add_row(f"{row['alpha']:g}", row["bound"], row["search"], get_search(row["search"]).short_guarantee,
                      mean_std(row["fdr_mean"], row["fdr_std"]),
                      fmt(row["fdr_above_alpha"], ".2f"),
                      mean_std(row["coverage_mean"], row["coverage_std"]),
                      fmt(row["correct_coverage_mean"]), str(row["fails"]), fmt(row["threshold_mean"], ".4g"),
                      f"{row['score_limit']:.3f}", f"{row['ceiling']:.3f}")
    return table


def _never_certified(frame: Any) -> list[str]:
    """For each alpha no split certified (every bound and search): why — the score (no threshold reaches it even
    in-sample) or the labels (how many: `cic calibrate` estimates it, which takes a while)."""
    lines = []
    for alpha in sorted(set(frame["alpha"].to_list())):
        rows = frame.filter(alpha=alpha)
        if rows["coverage_mean"].max() > 0:
            continue
        if rows["score_limit"][0] == 0:
            lines.append(f"alpha = {alpha:g}: never certified; no threshold on this score reaches it even in-sample: "
                         "more labels will not help; a better score or a looser alpha will")
        else:
            lines.append(f"alpha = {alpha:g}: never certified; this score reaches it in-sample, so too few labels: "
                         f"`cic calibrate --alpha {alpha:g}` estimates about how many more")
    return lines


COMMANDS = {"calibrate": calibrate, "evaluate": evaluate}  # simulate, report, bench, validity: `cic.cli.studies`


def guarantee_line(guarantee: str, score: str | None, explain: bool, coverage: Any = None) -> str:
    """What a calibration's guarantee rests on, in one line by default (the score and the guarantee's headline);
    the search's whole statement with --explain, and then the coverage certificate's (`cic.stats.coverage`) where
    the result `coverage` carries one."""
    named = f"score {score!r}; " if score else ""
    if explain:
        if coverage is not None and coverage.coverage_lcb is not None:
            from cic.stats.coverage import coverage_claim

            guarantee = f"{guarantee.rstrip('. ')}. Coverage: {coverage_claim(coverage.coverage_lcb, coverage.delta)}."
        return f"guarantee ({named.rstrip('; ')}): {guarantee}" if named else f"guarantee: {guarantee}"
    return f"guarantee: {named}{guarantee.split(':', 1)[0].strip()} (`--explain`: the whole statement)"
