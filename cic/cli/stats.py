"""Statistics commands on precomputed (score, error) tables: calibrate, evaluate, simulate, report, bench,
validity."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from cic.cli.common import (
    Alphas,
    BoundOpt,
    CalFraction,
    Delta,
    ForceOpt,
    GridOpt,
    NMin,
    NSplits,
    Search,
    Seed,
    Start,
    arena_choices,
    bound_choices,
    console,
    fmt,
    friendly_errors,
    load_pairs,
    mlflow_client,
    parse_floats,
    parse_grid,
    parse_ints,
    parse_names,
    printable,
    search_choices,
)
from cic.cli.option_groups import Columns, FileLabels, Grid, Judged, Splits, StoredRun, Study, grouped
from cic.errors import UserError
from cic.stats.searches import DEFAULT_SEARCH, SEARCH_NAMES

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


@friendly_errors
def simulate(
    n: Annotated[int, typer.Option("--n", help="Calibration set size.")] = 1000,
    alpha: Annotated[float, typer.Option("--alpha", help="Target error rate among accepted answers.")] = 0.1,
    delta: Delta = 0.05,
    bound: BoundOpt = "cp",
    search: Search = DEFAULT_SEARCH,
    grid: GridOpt = None,
    n_min: NMin = None,
    start: Start = None,
    trials: Annotated[int, typer.Option("--trials", help="Monte-Carlo calibration sets.")] = 2000,
    low: Annotated[float, typer.Option("--low", help="P(error | score = 0).")] = 0.0,
    high: Annotated[float, typer.Option("--high", help="P(error | score = 1).")] = 0.4,
    power: Annotated[float, typer.Option("--power", help="Shape of P(error | score).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated calibration sets.")] = 0,
) -> None:
    """Monte-Carlo validity: how often the certified threshold's true risk exceeds ALPHA."""
    from cic.stats.simulation import PowerRisk
    from cic.stats.simulation import simulate as run_simulation

    result = run_simulation(PowerRisk(low, high, power), n=n, alpha=alpha, delta=delta, bound=bound,
                            search=search, n_trials=trials, seed=seed, grid=parse_grid(grid, None, None, "score"),
                            n_min=n_min, start=start)
    console.print(result.summary(), highlight=False)


RANKING_TITLE = ("How each score ranks its errors, whatever the method (descriptive, no guarantee): PRR, AUARC, and "
                 "ECE where the score is one minus a probability")


def _ranking(frame: Any) -> tuple[str, Any]:
    """How each group's score ranks its errors (PRR, AUARC, ECE: `cic.reports.report.prr_study`), as printed and
    as a frame."""
    from cic.reports.report import prr_study
    from cic.reports.tables import prr_markdown

    ranking = prr_study(frame)
    return f"{RANKING_TITLE}\n\n{prr_markdown(ranking)}", ranking


def _write_bench(out: Path, tables: dict[str, tuple[str, Any]]) -> None:
    """Each of the bench's tables as NAME.md (as printed) and NAME.csv."""
    from cic.store.outputs import write_frame, write_text

    out.mkdir(parents=True, exist_ok=True)
    for name, (text, frame) in tables.items():
        write_text(out / f"{name}.md", text, f"{name} table")
        write_frame(frame, out / f"{name}.csv", f"{name} table")


def _bench_table(path: Path) -> Any:
    """A long table, or a harness's evaluation output (it names its own groups); a file without model or dataset
    columns is labelled "model" and its file name."""
    from cic.store.harness import harness_at
    from cic.store.score_files import read_long_table, read_table

    if path.exists() and harness_at(path) is not None:
        return read_long_table(path)
    columns = set(read_table(path).columns)
    defaults = {"model": "model", "dataset": path.stem}
    return read_long_table(path, labels={k: v for k, v in defaults.items() if k not in columns})


def _only(frame: Any, wanted: dict[str, str | None]) -> Any:
    """The rows of the given dataset / estimator / criterion (each must be in the tables)."""
    import polars as pl

    for column, value in wanted.items():
        if value is None:
            continue
        held = set(frame.get_column(column))
        if value not in held:
            raise UserError(f"--{column} = {value!r}: not in the tables (they hold {', '.join(sorted(held))})")
        frame = frame.filter(pl.col(column) == value)
    return frame


@friendly_errors
def bench(
    files: Annotated[list[Path], typer.Argument(help="Parquet, CSV or JSON-lines long score tables (model, dataset, "
                                                     "estimator, criterion, score, error) — the committed real "
                                                     "tables, your own — or a harness's output as `cic convert` "
                                                     "reads it (lm-eval, inspect-ai, HELM, lighteval).")],
    alphas: Alphas = "0.1,0.15,0.2,0.25",
    deltas: Annotated[str, typer.Option("--deltas", help="Comma-separated δ values.")] = "0.05",
    methods: Annotated[str | None, typer.Option("--methods", help=f"Comma-separated methods (default: all): "
                                                f"{arena_choices()}.")] = None,
    n_splits: NSplits = 500,
    cal_fraction: CalFraction = 0.5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the splits.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for arena.md, arena.csv and arena.png.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="Only this dataset's rows.")] = None,
    estimator: Annotated[str | None, typer.Option("--estimator", help="Only this estimator's rows.")] = None,
    criterion: Annotated[str | None, typer.Option("--criterion", help="Only this criterion's rows.")] = None,
) -> None:
    """A risk-control arena: every abstention method on the same splits of each table — coverage, mean FDR,
    P(FDR > α), the share of splits accepting nothing, time — with the guarantee each carries."""
    import polars as pl

    from cic.reports.arena import arena_figure, arena_markdown, run_arena
    from cic.store.outputs import guard_output_dir

    if out is not None:
        guard_output_dir(out, "--out", inputs=files)
    frame = _only(pl.concat([_bench_table(path) for path in files], how="diagonal_relaxed"),
                  {"dataset": dataset, "estimator": estimator, "criterion": criterion})
    rows = run_arena(frame, alphas=parse_floats(alphas, "--alphas"), deltas=parse_floats(deltas, "--deltas"),
                     methods=parse_names(methods) if methods else None, n_splits=n_splits,
                     cal_fraction=cal_fraction, seed=seed)
    tables = {"arena": (arena_markdown(rows), rows), "ranking": _ranking(frame)}
    for text, _ in tables.values():
        console.print(text, highlight=False, markup=False, soft_wrap=True)
    if out is not None:
        _write_bench(out, tables)
        arena_figure(rows, out / "arena.png")
        console.print(f"arena written to {out}/ (arena.md, arena.csv, arena.png, ranking.md, ranking.csv)",
                      highlight=False)


@friendly_errors
@grouped
def report(
    files: Annotated[list[Path], typer.Argument(help="Parquet, CSV or JSON-lines score tables: long layout (model, "
                                                     "dataset, estimator, criterion, score, error) or one group per "
                                                     "file.")],
    *,
    out: Annotated[Path, typer.Option("--out", help="Directory to write the report into.")] = Path("report"),
    labels: FileLabels,
    columns: Columns,
    splits: Splits,
    grid: GridOpt = None,
    study: Study,
    no_figures: Annotated[bool, typer.Option("--no-figures", help="Tables only.")] = False,
    mlflow_run_id: Annotated[str | None, typer.Option("--mlflow-run-id", help="Log the report directory as "
                                                                             "artifacts of this MLflow run.")] = None,
    group_by: Annotated[str | None, typer.Option("--group-by", metavar="dataset", help="Add the per-dataset table: "
                                                 "each model's datasets given gates certified at once (δ / G each) "
                                                 "beside the pooled gate, judged per dataset.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write into a directory that holds files cic did not "
                                        "write (cic replaces its own files there).")] = False,
) -> None:
    """Paper-style report: FDR / power tables, split-ratio study, baselines, figures, written to --out."""
    import polars as pl

    from cic.reports.report import write_report
    from cic.store.outputs import guard_output_dir
    from cic.store.score_files import read_long_table

    config = _report_config(splits, study, grid=grid, score_col=columns.score_col, figures=not no_figures,
                            group_by=group_by)
    client = mlflow_client(mlflow_run_id) if mlflow_run_id else None
    guard_output_dir(out, "--out", inputs=files, force=force)
    frames = [read_long_table(path, labels=each, **asdict(columns)) for path, each in zip(files, labels.each(files),
                                                                                          strict=True)]
    written = write_report(pl.concat(frames), out, config)
    console.print(f"report written to {out}/ ({len(written.tables)} tables, {len(written.figures)} figures); "
                  f"start at {out / 'README.md'}", highlight=False)
    if client is not None:
        client.log_artifacts(mlflow_run_id, str(out), artifact_path="report")
        console.print(f"logged as artifacts 'report/' of MLflow run {mlflow_run_id}", highlight=False)


def _report_config(splits: Splits, study: Study, *, grid: str | None, score_col: str, figures: bool,
                   group_by: str | None) -> Any:
    """The report's settings, parsed and checked before any work."""
    from cic.reports.report import ReportConfig

    if group_by not in (None, "dataset"):
        raise UserError(f"--group-by = {group_by!r}: the report groups by 'dataset' (or leave it out)")
    return ReportConfig(
        alphas=tuple(parse_floats(splits.alphas, "--alphas")), bounds=tuple(parse_names(splits.bounds)),
        searches=tuple(parse_names(splits.search)), delta=splits.delta, n_splits=splits.n_splits,
        cal_fraction=splits.cal_fraction, seed=splits.seed,
        grid=None if grid is None else tuple(parse_grid(grid, None, None, score_col)),
        sensitivity_fractions=tuple(parse_floats(study.fractions, "--fractions")),
        sensitivity_alphas=tuple(parse_floats(study.sensitivity_alphas, "--sensitivity-alphas")),
        baselines=tuple(parse_names(study.baselines)), baseline_bound=study.baseline_bound, figures=figures,
        budget_sizes=tuple(parse_floats(study.budget_sizes, "--budget-sizes")),
        group_by=group_by)


@friendly_errors
def validity(
    out: Annotated[Path, typer.Option("--out", help="Directory for the table and the plot.")] = Path("validity"),
    trials: Annotated[int, typer.Option("--trials", help="Monte-Carlo calibration sets per row.")] = 2000,
    ns: Annotated[str, typer.Option("--ns", help="Comma-separated calibration set sizes.")] = "200,1000,5000",
    alphas: Alphas = "0.1,0.2",
    searches: Annotated[str, typer.Option(
        "--searches", help=f"Comma-separated searches to check: {search_choices()}.")] = ",".join(SEARCH_NAMES),
    bounds: Annotated[str, typer.Option(
        "--bounds", help=f"Comma-separated bounds to check: {bound_choices()}.")] = "hoeffding,cp",
    scenarios: Annotated[str, typer.Option("--scenarios", help="crossing (R = 2αt), flat (R = 1.2α).")]
    = "crossing,flat",
    delta: Delta = 0.05,
    grid_size: Annotated[int, typer.Option("--grid-size", help="Bonferroni grid points over [0.05, 1].")] = 20,
    seed: Seed = 0,
    no_figure: Annotated[bool, typer.Option("--no-figure", help="Table only.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Write into a directory that holds files cic did not "
                                        "write (cic replaces its own files there).")] = False,
) -> None:
    """Monte-Carlo validity of every search and bound: violation rates with exact CIs against delta."""
    from cic.reports.validity import write_validity
    from cic.store.outputs import guard_output_dir

    guard_output_dir(out, "--out", force=force)
    table, _ = write_validity(out, figure=not no_figure, scenarios=parse_names(scenarios), ns=parse_ints(ns, "--ns"),
                              alphas=parse_floats(alphas, "--alphas"), searches=parse_names(searches),
                              bounds=parse_names(bounds),
                              delta=delta, n_trials=trials, seed=seed, grid_size=grid_size)
    shown = Table(title=f"P(R(t̂) > α) over {trials} calibration sets, δ = {delta:g}")
    for col in ("scenario", "n", "α", "search", "bound", "violation rate [95% CI]", "vs δ", "fails"):
        shown.add_column(col, justify="left" if col in ("scenario", "search", "bound", "vs δ") else "right")
    for r in table.iter_rows(named=True):
        shown.add_row(r["scenario"], str(r["n"]), f"{r['alpha']:g}", r["search"], r["bound"],
                      f"{r['violation_rate']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]",
                      r["verdict"].replace("delta", "δ"), str(r["fails"]))
    console.print(shown)
    console.print(f"written to {out}/ (README.md, validity.md, validity.csv"
                  f"{'' if no_figure else ', validity.png'})", highlight=False)


COMMANDS = {"calibrate": calibrate, "evaluate": evaluate, "simulate": simulate, "report": report, "bench": bench,
            "validity": validity}


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
