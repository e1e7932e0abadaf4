"""Studies of searches and bounds on (score, error) tables: simulate (validity on simulated data), report (the
paper's tables and figures), bench (the arena: searches and baselines ranked), validity (violation rates)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cic.cli.common import (
    Alphas,
    BoundOpt,
    CalFraction,
    Delta,
    GridOpt,
    NMin,
    NSplits,
    Search,
    Seed,
    Start,
    arena_choices,
    bound_choices,
    console,
    friendly_errors,
    mlflow_client,
    parse_floats,
    parse_grid,
    parse_ints,
    parse_names,
    search_choices,
)
from cic.cli.option_groups import Columns, FileLabels, Splits, Study, grouped
from cic.errors import UserError
from cic.stats.searches import DEFAULT_SEARCH, SEARCH_NAMES


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


COMMANDS = {"simulate": simulate, "report": report, "bench": bench, "validity": validity}
