"""Options several commands share, declared once: a frozen dataclass whose fields are Typer options. `@grouped`
shows each group's fields to Typer as the command's own options and calls the command with the filled-in group,
so `calibrate`, `evaluate` and `report` do not each declare the same columns, splits and grid."""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import asdict, dataclass, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from cic.cli.common import (
    Alphas,
    Bounds,
    CalFraction,
    CorrectCol,
    CriterionOpt,
    DatasetOpt,
    Delta,
    ErrorCol,
    EstimatorOpt,
    GridOpt,
    GridSize,
    LabelOpt,
    ModelOpt,
    NMin,
    NSplits,
    PilotOpt,
    RunKeyOpt,
    ScoreCol,
    Searches,
    Seed,
    Start,
    parse_grid,
    per_file,
)
from cic.errors import UserError
from cic.stats.searches import DEFAULT_SEARCH

__all__ = ["Columns", "FileLabels", "Grid", "Judged", "Splits", "StoredRun", "Study", "grouped"]


@dataclass(frozen=True)
class Columns:
    """Which columns of a plain table hold the score and the error (or correctness)."""

    score_col: ScoreCol = "score"
    error_col: ErrorCol = "error"
    correct_col: CorrectCol = None


def _filters(self: Any) -> dict[str, str | None]:
    """The stored group asked for, by column (None: not given)."""
    return asdict(self)


#: Which stored results of a pipeline DuckDB file to read (`.filters()`: by column).
StoredRun = make_dataclass("StoredRun", [("model", ModelOpt, None), ("dataset", DatasetOpt, None),
                                         ("estimator", EstimatorOpt, None), ("criterion", CriterionOpt, None),
                                         ("run_key", RunKeyOpt, None)], frozen=True, namespace={"filters": _filters})


@dataclass(frozen=True)
class Splits:
    """The paper's protocol: risk levels, bounds, searches, δ and the repeated calibration/test splits."""

    alphas: Alphas = "0.05,0.10,0.15,0.20,0.25"
    bounds: Bounds = "hoeffding,cp"
    search: Searches = DEFAULT_SEARCH
    delta: Delta = 0.05
    n_splits: NSplits = 100
    cal_fraction: CalFraction = 0.5
    seed: Seed = 0


@dataclass(frozen=True)
class Grid:
    """Where a search may test: a grid fixed in advance (uniform or a pilot's quantiles) and the chains' floor."""

    grid: GridOpt = None
    pilot: PilotOpt = None
    grid_size: GridSize = None
    n_min: NMin = None
    start: Start = None

    def points(self, score_col: str) -> Any:
        """The grid as the searches take it (None where no grid was asked for)."""
        return parse_grid(self.grid, self.pilot, self.grid_size, score_col)


@dataclass(frozen=True)
class Judged:
    """Certify with a judge's labels on every question corrected by people's on a random subset
    (`cic.calibrate_judged`): the two label columns of a plain table."""

    judge_col: Annotated[str | None, typer.Option("--judge-col", help="Column of a judge's verdict on every question "
                                                                      "(1/true = wrong); with --human-col.")] = None
    human_col: Annotated[str | None, typer.Option("--human-col", help="Column of people's verdict (1/true = wrong), "
                                                                      "empty where no person labelled; people label "
                                                                      "a random subset.")] = None

    def check(self, **others: Any) -> bool:
        """Whether a judge-plus-people calibration was asked for; both columns or neither, and no option it
        cannot serve (`others`: option name -> value, None when not given)."""
        if (self.judge_col is None) != (self.human_col is None):
            given, missing = (("--judge-col", "--human-col") if self.human_col is None
                              else ("--human-col", "--judge-col"))
            raise UserError(f"{given} needs {missing}: a judge's labels are certified only with people's correction")
        clash = [name for name, value in others.items() if value not in (None, False)]
        if self.judge_col is not None and clash:
            raise UserError(f"--judge-col/--human-col certify one table's gate; drop {', '.join(clash)}")
        return self.judge_col is not None


def _labels_of(self: Any, files: list[Path]) -> list[dict[str, str | None]]:
    """Each file's labels, in file order."""
    given = {name: per_file(getattr(self, name), len(files), name) for name in LABELS}
    return [{name: values[i] for name, values in given.items()} for i in range(len(files))]


LABELS = ("model", "dataset", "estimator", "criterion")
#: Labels for files without the column: once for all files or once per file (`.each(files)`: per file).
FileLabels = make_dataclass("FileLabels", [(name, LabelOpt, None) for name in LABELS], frozen=True,
                            namespace={"each": _labels_of})


@dataclass(frozen=True)
class Study:
    """The report's split-ratio study, its baselines and its label-budget curve."""

    fractions: Annotated[str, typer.Option("--fractions", help="Calibration fractions of the split-ratio study "
                                                               "('' skips it).")] = "0.5,0.4,0.3,0.2,0.1"
    sensitivity_alphas: Annotated[str, typer.Option("--sensitivity-alphas", help="Risk levels of the split-ratio "
                                                                                "study.")] = "0.1"
    baselines: Annotated[str, typer.Option("--baselines", help="Comma-separated baselines ('' skips them): naive, "
                                                               "coin_binary, conformal_alignment, lec.")] = (
        "naive,coin_binary,conformal_alignment,lec")
    baseline_bound: Annotated[str, typer.Option("--baseline-bound", help="Bound of CIC and COIN in the baselines "
                                                                         "table.")] = "cp"
    budget_sizes: Annotated[str, typer.Option("--budget-sizes", help="The label-budget curve's calibration sizes, as "
                                                                     "multiples of each group's table ('' skips "
                                                                     "it).")] = "0.25,0.5,1,2,4,8"


def grouped(command: Any) -> Any:
    """Let Typer see each dataclass-typed parameter of `command` as that group's fields (keyword options, in field
    order, where the parameter stood) and call `command` with the group built from them."""
    hints = typing.get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for param in inspect.signature(command).parameters.values():
        kind = hints.get(param.name, param.annotation)
        if not (isinstance(kind, type) and is_dataclass(kind)):
            params.append(param.replace(annotation=kind, kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        groups[param.name] = kind
        field_hints = typing.get_type_hints(kind, include_extras=True)
        for field in fields(kind):
            params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                                            annotation=field_hints[field.name]))

    @functools.wraps(command)
    def wrapper(**options: Any) -> Any:
        for name, kind in groups.items():
            options[name] = kind(**{field.name: options.pop(field.name) for field in fields(kind)})
        return command(**options)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # Typer reads the signature above, not the command's own
    return wrapper
