"""The `cic` command line: calibrate and evaluate precomputed (score, error) tables, check validity."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="CIC: certified abstention thresholds for LLM answers.")
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

F = TypeVar("F", bound=Callable[..., Any])


def _friendly_errors(func: F) -> F:
    """Turn input errors (ValueError) into a one-line message and exit status 2, not a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} = {text!r}: expected comma-separated numbers, e.g. 0.05,0.1") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _grid(grid: str | None, pilot: Path | None, grid_size: int | None, score_col: str) -> Any:
    """--grid LOW:HIGH:K (uniform) or --pilot FILE --grid-size K (quantiles of a separate pilot sample)."""
    from cic.calibration import quantile_grid, uniform_grid
    from cic.tables import read_table

    if grid is not None and pilot is not None:
        raise ValueError("give either --grid LOW:HIGH:K or --pilot FILE, not both")
    if grid is not None:
        parts = grid.split(":")
        if len(parts) != 3:
            raise ValueError(f"--grid = {grid!r}: expected LOW:HIGH:K, e.g. 0:2.3:50")
        try:
            return uniform_grid(float(parts[0]), float(parts[1]), int(parts[2]))
        except ValueError as exc:
            raise ValueError(f"--grid = {grid!r}: {exc}") from None
    if pilot is not None:
        if grid_size is None:
            raise ValueError("--pilot needs --grid-size K (number of quantile thresholds)")
        frame = read_table(pilot)
        if score_col not in frame.columns:
            raise ValueError(f"column {score_col!r} not found in {str(pilot)!r}")
        return quantile_grid(frame.get_column(score_col).to_numpy(), grid_size)
    return None


def _load(file: Path, score_col: str, error_col: str, correct_col: str | None,
          stored: dict[str, str | None] | None = None) -> tuple[Any, Any]:
    """(scores, errors) from a Parquet/CSV table, or from a pipeline DuckDB file (FILE ending in .duckdb)."""
    from cic.tables import read_table, score_error_arrays

    if file.suffix == ".duckdb":
        return _load_stored(file, stored or {})
    return score_error_arrays(read_table(file), score_col=score_col, error_col=error_col,
                              correct_col=correct_col, source=repr(str(file)))


def _load_stored(db: Path, stored: dict[str, str | None]) -> tuple[Any, Any]:
    """The (score, error) pairs of one stored group: --model, --dataset, --estimator, --criterion name it."""
    from cic.store import Store

    missing = [f"--{k.replace('_', '-')}" for k in ("model", "dataset", "estimator", "criterion") if not stored.get(k)]
    if missing:
        raise ValueError(f"{str(db)!r} is a DuckDB store: name the group with {', '.join(missing)}")
    if not db.exists():
        raise ValueError(f"FILE = {str(db)!r}: no such file")
    with Store.open(db, read_only=True) as store:
        pairs = store.calibration_frame(stored["model"], stored["dataset"], stored["estimator"],
                                        stored["criterion"], run_key=stored.get("run_key"), allow_partial=True)
    return pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy()


ModelOpt = Annotated[str | None, typer.Option("--model", help="Stored results (FILE.duckdb): the model name.")]
DatasetOpt = Annotated[str | None, typer.Option("--dataset", help="Stored results: the dataset name.")]
EstimatorOpt = Annotated[str | None, typer.Option("--estimator", help="Stored results: the estimator, e.g. "
                                                                      "'semantic_entropy[embedding:0.9]'.")]
CriterionOpt = Annotated[str | None, typer.Option("--criterion", help="Stored results: e.g. 'similarity[0.6]'.")]
RunKeyOpt = Annotated[str | None, typer.Option("--run-key", help="Stored results: choose among several runs.")]
ScoreCol = Annotated[str, typer.Option("--score-col", help="Column with the uncertainty score (lower = surer).")]
ErrorCol = Annotated[str, typer.Option("--error-col", help="Column with 1 where the answer is wrong.")]
CorrectCol = Annotated[str | None, typer.Option("--correct-col",
                                                help="Use a column with 1 where the answer is right instead.")]
Delta = Annotated[float, typer.Option("--delta", help="Allowed probability that the guarantee fails.")]
Search = Annotated[str, typer.Option("--search", help="paper | bonferroni | fixed_sequence")]
GridOpt = Annotated[str | None, typer.Option("--grid", help="Uniform grid LOW:HIGH:K fixed in advance.")]
PilotOpt = Annotated[Path | None, typer.Option("--pilot", help="Pilot file whose score quantiles form the grid.")]
GridSize = Annotated[int | None, typer.Option("--grid-size", help="Number of pilot quantiles.")]
NMin = Annotated[int | None, typer.Option("--n-min", help="fixed_sequence: first test at this accepted count.")]
Start = Annotated[float | None, typer.Option("--start", help="fixed_sequence: first threshold tested.")]
Alphas = Annotated[str, typer.Option("--alphas", help="Comma-separated risk levels.")]
Bounds = Annotated[str, typer.Option("--bounds", help="Comma-separated bounds.")]
Searches = Annotated[str, typer.Option("--search", help="Comma-separated searches.")]
NSplits = Annotated[int, typer.Option("--n-splits", help="Random calibration/test splits.")]
CalFraction = Annotated[float, typer.Option("--cal-fraction", help="Share of items used to calibrate.")]
Seed = Annotated[int, typer.Option("--seed")]


@app.command()
@_friendly_errors
def calibrate(
    file: Annotated[Path, typer.Argument(help="Parquet or CSV table of calibration items, or a pipeline "
                                              "DuckDB file (with --model/--dataset/--estimator/--criterion).")],
    alpha: Annotated[float, typer.Option("--alpha", help="Target error rate among accepted answers.")],
    score_col: ScoreCol = "score",
    error_col: ErrorCol = "error",
    correct_col: CorrectCol = None,
    delta: Delta = 0.05,
    bound: Annotated[str, typer.Option("--bound", help="cp | hoeffding | hoeffding_kl | bentkus | "
                                                       "hoeffding_bentkus")] = "cp",
    search: Search = "paper",
    grid: GridOpt = None,
    pilot: PilotOpt = None,
    grid_size: GridSize = None,
    n_min: NMin = None,
    start: Start = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")] = None,
    gate_out: Annotated[Path | None, typer.Option("--gate", help="Write the serving gate JSON here.")] = None,
    show_table: Annotated[bool, typer.Option("--table", help="Print every candidate threshold.")] = False,
    model: ModelOpt = None,
    dataset: DatasetOpt = None,
    estimator: EstimatorOpt = None,
    criterion: CriterionOpt = None,
    run_key: RunKeyOpt = None,
) -> None:
    """Certify the largest threshold whose error rate among accepted answers is <= ALPHA."""
    from cic.calibration import calibrate as run_calibration

    scores, errors = _load(file, score_col, error_col, correct_col, {
        "model": model, "dataset": dataset, "estimator": estimator, "criterion": criterion, "run_key": run_key})
    result = run_calibration(scores, errors, alpha=alpha, delta=delta, bound=bound, search=search,
                             grid=_grid(grid, pilot, grid_size, score_col), n_min=n_min, start=start)
    console.print(result.summary(), highlight=False)
    console.print(f"guarantee: {result.guarantee}", style="dim", highlight=False)
    if show_table:
        console.print(result.table())
    if json_out is not None:
        json_out.write_text(result.to_json(include_table=show_table) + "\n")
        console.print(f"result written to {json_out}", style="dim")
    if gate_out is not None:
        gate_out.write_text(result.gate().to_json() + "\n")
        console.print(f"gate written to {gate_out}", style="dim")


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


@app.command()
@_friendly_errors
def evaluate(
    file: Annotated[Path, typer.Argument(help="Parquet or CSV table of labelled items, or a pipeline DuckDB "
                                              "file (with --model/--dataset/--estimator/--criterion).")],
    score_col: ScoreCol = "score",
    error_col: ErrorCol = "error",
    correct_col: CorrectCol = None,
    alphas: Alphas = "0.05,0.10,0.15,0.20,0.25",
    bounds: Bounds = "hoeffding,cp",
    search: Searches = "paper",
    delta: Delta = 0.05,
    n_splits: NSplits = 100,
    cal_fraction: CalFraction = 0.5,
    seed: Seed = 0,
    grid: GridOpt = None,
    pilot: PilotOpt = None,
    grid_size: GridSize = None,
    n_min: NMin = None,
    start: Start = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the table (.csv or .parquet).")] = None,
    model: ModelOpt = None,
    dataset: DatasetOpt = None,
    estimator: EstimatorOpt = None,
    criterion: CriterionOpt = None,
    run_key: RunKeyOpt = None,
) -> None:
    """The paper's protocol: FDR, coverage and fails over repeated calibration/test splits."""
    from cic.protocol import evaluate_splits

    scores, errors = _load(file, score_col, error_col, correct_col, {
        "model": model, "dataset": dataset, "estimator": estimator, "criterion": criterion, "run_key": run_key})
    frame = evaluate_splits(scores, errors, alphas=_floats(alphas, "--alphas"), bounds=_names(bounds),
                            search=_names(search), delta=delta, n_splits=n_splits, cal_fraction=cal_fraction,
                            seed=seed, grid=_grid(grid, pilot, grid_size, score_col), n_min=n_min, start=start)
    table = Table(title=f"{file.name}: {n_splits} splits, cal_fraction {cal_fraction:g}, delta {delta:g}, "
                        f"base error rate {frame['base_error_rate'][0]:.3f}")
    for col in ("alpha", "bound", "search", "FDR (mean ± std)", "test FDR > α", "coverage", "correct cov.",
                "fails", "threshold"):
        table.add_column(col, justify="right" if col not in ("bound", "search") else "left")
    for row in frame.iter_rows(named=True):
        fdr = "—" if row["fdr_mean"] is None else f"{row['fdr_mean']:.3f} ± {row['fdr_std']:.3f}"
        table.add_row(f"{row['alpha']:g}", row["bound"], row["search"], fdr, _fmt(row["fdr_above_alpha"], ".2f"),
                      f"{row['coverage_mean']:.3f} ± {row['coverage_std']:.3f}",
                      _fmt(row["correct_coverage_mean"]), str(row["fails"]), _fmt(row["threshold_mean"], ".4g"))
    console.print(table)
    if out is not None:
        suffix = out.suffix.lower()
        if suffix == ".csv":
            frame.write_csv(out)
        elif suffix in (".parquet", ".pq"):
            frame.write_parquet(out)
        else:
            raise ValueError(f"--out = {str(out)!r}: use a .csv or .parquet file name")
        console.print(f"table written to {out}", style="dim")


@app.command()
@_friendly_errors
def simulate(
    n: Annotated[int, typer.Option("--n", help="Calibration set size.")] = 1000,
    alpha: Annotated[float, typer.Option("--alpha")] = 0.1,
    delta: Delta = 0.05,
    bound: Annotated[str, typer.Option("--bound")] = "cp",
    search: Search = "paper",
    grid: GridOpt = None,
    n_min: NMin = None,
    start: Start = None,
    trials: Annotated[int, typer.Option("--trials", help="Monte-Carlo calibration sets.")] = 2000,
    low: Annotated[float, typer.Option("--low", help="P(error | score = 0).")] = 0.0,
    high: Annotated[float, typer.Option("--high", help="P(error | score = 1).")] = 0.4,
    power: Annotated[float, typer.Option("--power", help="Shape of P(error | score).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Monte-Carlo validity: how often the certified threshold's true risk exceeds ALPHA."""
    from cic.simulation import PowerRisk
    from cic.simulation import simulate as run_simulation

    result = run_simulation(PowerRisk(low, high, power), n=n, alpha=alpha, delta=delta, bound=bound,
                            search=search, n_trials=trials, seed=seed, grid=_grid(grid, None, None, "score"),
                            n_min=n_min, start=start)
    console.print(result.summary(), highlight=False)


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} = {text!r}: expected comma-separated integers, e.g. 200,1000") from None


def _per_file(values: list[str] | None, n_files: int, name: str) -> list[str | None]:
    """A label given once applies to every file; given once per file, in file order."""
    if not values:
        return [None] * n_files
    if len(values) == 1:
        return values * n_files
    if len(values) != n_files:
        raise ValueError(f"--{name} was given {len(values)} times for {n_files} files: give it once (all files) "
                         "or once per file")
    return list(values)


def _mlflow_client(run_id: str) -> Any:
    """A tracking client for an existing run (MLFLOW_TRACKING_URI), checked before any work is done."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    try:
        client.get_run(run_id)
    except MlflowException as exc:
        raise ValueError(f"--mlflow-run-id = {run_id!r}: {exc.message}") from None
    return client


LabelOpt = Annotated[list[str] | None, typer.Option(help="Label for files without this column: once for all files "
                                                         "or once per file.")]


DbOpt = Annotated[Path, typer.Option("--db", help="DuckDB file of the store.")]

@app.command()
@_friendly_errors
def report(
    files: Annotated[list[Path], typer.Argument(help="Parquet or CSV score tables: long layout (model, dataset, "
                                                     "estimator, criterion, score, error) or one group per file.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the report into.")] = Path("report"),
    model: LabelOpt = None,
    dataset: LabelOpt = None,
    estimator: LabelOpt = None,
    criterion: LabelOpt = None,
    score_col: ScoreCol = "score",
    error_col: ErrorCol = "error",
    correct_col: CorrectCol = None,
    alphas: Alphas = "0.05,0.10,0.15,0.20,0.25",
    bounds: Bounds = "hoeffding,cp",
    search: Searches = "paper",
    delta: Delta = 0.05,
    n_splits: NSplits = 100,
    cal_fraction: CalFraction = 0.5,
    seed: Seed = 0,
    grid: GridOpt = None,
    fractions: Annotated[str, typer.Option("--fractions", help="Calibration fractions of the split-ratio study "
                                                               "('' skips it).")] = "0.5,0.4,0.3,0.2,0.1",
    sensitivity_alphas: Annotated[str, typer.Option("--sensitivity-alphas", help="Risk levels of the split-ratio "
                                                                                "study.")] = "0.1",
    baselines: Annotated[str, typer.Option("--baselines", help="Comma-separated baselines ('' skips them): naive, "
                                                               "coin_binary, conformal_alignment, lec.")]
    = "naive,coin_binary,conformal_alignment,lec",
    baseline_bound: Annotated[str, typer.Option("--baseline-bound", help="Bound of CIC and COIN in the baselines "
                                                                         "table.")] = "cp",
    no_figures: Annotated[bool, typer.Option("--no-figures", help="Tables only.")] = False,
    mlflow_run_id: Annotated[str | None, typer.Option("--mlflow-run-id", help="Log the report directory as "
                                                                             "artifacts of this MLflow run.")] = None,
) -> None:
    """Paper-style report: FDR / power tables, split-ratio study, baselines, figures, written to --out."""
    import polars as pl

    from cic.report import ReportConfig, write_report
    from cic.tables import read_long_table

    client = _mlflow_client(mlflow_run_id) if mlflow_run_id else None
    labels = {name: _per_file(values, len(files), name) for name, values in
              (("model", model), ("dataset", dataset), ("estimator", estimator), ("criterion", criterion))}
    frames = [read_long_table(path, labels={k: v[i] for k, v in labels.items()}, score_col=score_col,
                              error_col=error_col, correct_col=correct_col) for i, path in enumerate(files)]
    config = ReportConfig(
        alphas=tuple(_floats(alphas, "--alphas")), bounds=tuple(_names(bounds)), searches=tuple(_names(search)),
        delta=delta, n_splits=n_splits, cal_fraction=cal_fraction, seed=seed,
        grid=None if grid is None else tuple(_grid(grid, None, None, score_col)),
        sensitivity_fractions=tuple(_floats(fractions, "--fractions")),
        sensitivity_alphas=tuple(_floats(sensitivity_alphas, "--sensitivity-alphas")),
        baselines=tuple(_names(baselines)), baseline_bound=baseline_bound, figures=not no_figures)
    written = write_report(pl.concat(frames), out, config)
    console.print(f"report written to {out}/ ({len(written.tables)} tables, {len(written.figures)} figures); "
                  f"start at {out / 'README.md'}", highlight=False)
    if client is not None:
        client.log_artifacts(mlflow_run_id, str(out), artifact_path="report")
        console.print(f"logged as artifacts 'report/' of MLflow run {mlflow_run_id}", highlight=False)

@app.command()
@_friendly_errors
def validity(
    out: Annotated[Path, typer.Option("--out", help="Directory for the table and the plot.")] = Path("validity"),
    trials: Annotated[int, typer.Option("--trials", help="Monte-Carlo calibration sets per row.")] = 2000,
    ns: Annotated[str, typer.Option("--ns", help="Comma-separated calibration set sizes.")] = "200,1000,5000",
    alphas: Alphas = "0.1,0.2",
    searches: Annotated[str, typer.Option("--searches")] = "paper,bonferroni,fixed_sequence",
    bounds: Annotated[str, typer.Option("--bounds")] = "hoeffding,cp",
    scenarios: Annotated[str, typer.Option("--scenarios", help="crossing (R = 2αt), flat (R = 1.2α).")]
    = "crossing,flat",
    delta: Delta = 0.05,
    grid_size: Annotated[int, typer.Option("--grid-size", help="Bonferroni grid points over [0.05, 1].")] = 20,
    seed: Seed = 0,
    no_figure: Annotated[bool, typer.Option("--no-figure", help="Table only.")] = False,
) -> None:
    """Monte-Carlo validity of every search and bound: violation rates with exact CIs against delta."""
    from cic.validity import write_validity

    table, _ = write_validity(out, figure=not no_figure, scenarios=_names(scenarios), ns=_ints(ns, "--ns"),
                              alphas=_floats(alphas, "--alphas"), searches=_names(searches), bounds=_names(bounds),
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

@app.command()
@_friendly_errors
def datasets(
    name: Annotated[str | None, typer.Argument(help="Dataset to load; omit to list the registry.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="'sample' (default), 'hub', a hub id, or a "
                                                               "JSONL/Parquet file or directory.")] = None,
    split: Annotated[str, typer.Option("--split")] = "validation",
    limit: Annotated[int | None, typer.Option("--limit", help="Keep this many questions.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="With --limit: a seeded random subset.")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="Also store the questions in this DuckDB file.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the questions to this .parquet.")] = None,
    show_prompt: Annotated[bool, typer.Option("--prompt", help="Print the prompt of the first question.")] = False,
) -> None:
    """List the registered datasets, or load one and show, store (--db) or save (--out) its questions."""
    from cic.data import DATASETS, build_prompt, load_questions

    if name is None:
        table = Table(title="registered datasets")
        for col in ("name", "prompt", "hub", "offline sample", "description"):
            table.add_column(col)
        for spec in DATASETS:
            hub = f"{spec.hub_id} ({spec.hub_config})" if spec.hub_config else (spec.hub_id or "—")
            table.add_row(spec.name, spec.prompt.prompt_id, hub, spec.sample or spec.default_source or "—",
                          spec.description)
        console.print(table)
        return
    questions = load_questions(name, source, split=split, limit=limit, seed=seed)
    if out is not None:
        if out.suffix.lower() not in (".parquet", ".pq"):
            raise ValueError(f"--out = {str(out)!r}: give a .parquet file name")
        questions.write_parquet(out)
        console.print(f"questions written to {out}", style="dim")
    if db is not None:
        from cic.store import Store

        with Store.open(db) as store:
            store.upsert("questions", questions)
            total = store.count("questions", dataset=name, split=split)
        console.print(f"{questions.height} questions stored in {db} ({total} {name}/{split} questions in total)")
    console.print(f"{name} ({split}): {questions.height} questions", highlight=False)
    with_answers = questions.select("question_id", "question", "answer").head(5)
    console.print(with_answers)
    if show_prompt and questions.height:
        console.print(build_prompt(questions.row(0, named=True)), highlight=False, markup=False)


def _filters(where: list[str], table: str) -> dict[str, Any]:
    """--where column=value options as typed equality filters for Store.read."""
    import polars as pl

    from cic.schema import TABLES

    if table not in TABLES:
        raise ValueError(f"table = {table!r}: unknown; tables are {', '.join(TABLES)}")
    filters: dict[str, Any] = {}
    for item in where:
        column, sep, text = item.partition("=")
        if not sep or column not in TABLES[table].columns:
            raise ValueError(f"--where {item!r}: expected COLUMN=VALUE with a column of {table}: "
                             f"{', '.join(TABLES[table].columns)}")
        try:
            filters[column] = pl.Series([text]).cast(TABLES[table].columns[column]).item()
        except Exception:  # polars raises several types for a failed cast
            raise ValueError(f"--where {item!r}: {text!r} is not a valid {TABLES[table].columns[column]}") from None
    return filters

@app.command()
@_friendly_errors
def export(
    table: Annotated[str, typer.Argument(help="Table: questions, runs, generations, scores, labels, "
                                              "calibrations or evaluations.")],
    out: Annotated[Path, typer.Argument(help="Parquet file to write.")],
    db: DbOpt = Path("cic.duckdb"),
    where: Annotated[list[str] | None, typer.Option("--where", help="Keep rows with COLUMN=VALUE (repeatable).")]
    = None,
) -> None:
    """Write a stored table to Parquet (read it back anywhere, or `cic import` it into another store)."""
    from cic.store import Store

    filters = _filters(where or [], table)
    with Store.open(db, read_only=True) as store:
        rows = store.export(table, out, **filters)
    console.print(f"{rows} {table} rows written to {out}")


@app.command("import")
@_friendly_errors
def import_table(
    file: Annotated[Path, typer.Argument(help="Parquet file written by `cic export` (or with a table's columns).")],
    db: DbOpt = Path("cic.duckdb"),
    table: Annotated[str | None, typer.Option("--table", help="Target table when the file does not name it.")]
    = None,
) -> None:
    """Upsert a Parquet table into the store (idempotent: importing twice changes nothing)."""
    from cic.store import Store

    with Store.open(db) as store:
        name, rows = store.import_(file, table)
        total = store.count(name)
    console.print(f"{rows} {name} rows imported into {db} ({total} in the table)")


from cic import cli_pipeline  # noqa: E402,F401  (registers run, recalibrate, log, ask)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
