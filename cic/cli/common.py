"""What every `cic` command shares: consoles, the error wrapper, option types and small parsers."""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import sys
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.table import Table
from rich.text import Text

from cic.errors import UserError

PIPED_WIDTH = 140  # a log file's lines when nothing says how wide: a table's columns are not folded early


def console_width(stream: Any) -> int | None:
    """The width to print at: the terminal's, else $COLUMNS (a pipe whose reader said how wide, e.g.
    `COLUMNS=100 cic gate list | less`), else PIPED_WIDTH. None lets rich measure the terminal."""
    if stream.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and 20 <= int(columns) <= 1000 else PIPED_WIDTH


class StreamConsole(Console):
    """A rich Console whose width follows the stream it prints to at the moment it prints (a width fixed at
    import would keep whatever stdout was then, e.g. a terminal that a later redirect or test runner replaced)."""

    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        measured = Console.size.fget(self)  # type: ignore[attr-defined]
        width = console_width(self.file)
        return measured if width is None else ConsoleDimensions(width, measured.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """A message (one str or Text) names the store this command read in its `cic gate …` commands
        (`advise_on`) and, unless the caller chose how it wraps, breaks between words only: a path, a URL or a
        command longer than the rest of its line starts the next one whole instead of being folded inside (rich's
        default), so what a person copies from it runs. A table prints as rich draws it when every column fits at
        its longest word, else one block per row (`cic.cli.fitted_table`)."""
        if len(objects) == 1 and isinstance(objects[0], Table):
            from cic.cli.fitted_table import fitted

            lines = fitted(objects[0], self)
            if lines is not None:  # one block per row: each line a message (whole words, wrapped between them)
                for line in lines:
                    self.print(line, **kwargs)
                return
        if len(objects) == 1 and isinstance(objects[0], str | Text):
            text = _on_advised_store(objects[0] if isinstance(objects[0], Text) else Text(objects[0]))
            if kwargs.get("soft_wrap") is None and kwargs.get("overflow") is None:
                kwargs["soft_wrap"] = True
                text = Text("\n").join(whole_word_lines(text, self.width))
            objects = (text,)
        super().print(*objects, **kwargs)


_WORD = re.compile(r"\S+\s*")


def whole_word_lines(text: Text, width: int) -> list[Text]:
    """`text`'s lines, each cut between words to fit `width` (a word wider than `width` stays whole, alone)."""
    out: list[Text] = []
    for line in text.split("\n", allow_blank=True):
        plain, start, offsets = line.plain, 0, []
        for word in _WORD.finditer(plain):
            if word.start() > start and len(plain[start:word.end()].rstrip()) > width:
                offsets.append(word.start())
                start = word.start()
        for piece in line.divide(offsets):
            piece.rstrip()
            out.append(piece)
    return out


# markup and emoji codes are off: file names, model names and values in errors are printed as they are
# (a "[/]" or ":b:" in them is text, not a style); styled words are built as rich Text, never parsed
console = StreamConsole(markup=False, emoji=False, highlight=False)
err_console = StreamConsole(stderr=True, markup=False, emoji=False, highlight=False)
READ_WAIT_S = 120.0  # how long a reading command waits for a writer to let go of the store (it says so once)


def say_waiting(line: str) -> None:
    """The one line a command prints when it starts waiting for the store (unwrapped, to stderr)."""
    err_console.print(printable(line), soft_wrap=True)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\t": "\\t"}


def printable(text: object) -> str:
    """Text safe for a terminal on one line: a newline or tab as \\n / \\t (a name from a user's file must not
    split a line or a table row) and other control characters and escape sequences (ANSI colours, cursor moves, a
    carriage return that hides what came before) as \\xNN instead of acting on the terminal."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), str(text))


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line whose (text, style) parts are styled and whose plain parts are printed verbatim."""
    return Text.assemble(*parts)

TrackingOpt = Annotated[str | None, typer.Option(
    "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).")]

F = TypeVar("F", bound=Callable[..., Any])


def _run_log(record: logging.LogRecord) -> bool:
    """Logger filter on Prefect's flow- and task-run loggers: mark their records for `_console_view` (which the
    console handler gets on first use: Prefect creates it when it is imported). The run's log in the Prefect UI
    keeps every record as it was."""
    record.cic_run_log = True
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and "cic.store" in sys.modules:
        from cic.store.database import StoreError

        record.cic_store_error = isinstance(exc, StoreError)
    for handler in logging.getLogger().handlers:  # Prefect's console handler sits on the root logger
        if not isinstance(handler, logging.FileHandler) and _console_view not in handler.filters:
            handler.addFilter(_console_view)
    return True


def _console_view(record: logging.LogRecord) -> bool:
    """Console filter for flow- and task-run records: names from users' files printed escaped (`printable`), and
    a run that a store error ended (a damaged block, a full disk) left out, traceback and all: `friendly_errors`
    prints it as one line."""
    if not getattr(record, "cic_run_log", False):
        return True
    if getattr(record, "cic_store_error", False):
        return False
    message = record.getMessage()
    safe = printable(message)
    if safe != message:  # the API handler already sent the record (its handlers run before the root's)
        record.msg, record.args = safe, ()
    return True


def friendly_errors(func: F) -> F:
    """Turn input errors (`cic.errors.UserError`) into a one-line message and exit status 2; anything else is a
    bug or a failing service and keeps its traceback (exit 1)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            run_logger = logging.getLogger(name)
            if _run_log not in run_logger.filters:
                run_logger.addFilter(_run_log)
        token = _ADVISED_STORE.set(str(kwargs["db"]) if kwargs.get("db") is not None else None)
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            err_console.print(styled(("error:", "bold red"), " ", printable(" ".join(str(exc).split()))),
                              soft_wrap=True)
            raise typer.Exit(2) from None
        finally:
            _ADVISED_STORE.reset(token)

    return wrapper  # type: ignore[return-value]


def flow_outcome(state: Any, failure: type[BaseException]) -> tuple[dict[str, Any], bool]:
    """(summary, failed) of a flow called with `return_state=True`: a `failure` result carries the summary of a
    run that ended Failed on purpose (a failed model, an alert); any other exception is raised."""
    result = state.result(raise_on_failure=False)
    if isinstance(result, failure):
        return result.summary, True  # type: ignore[attr-defined]
    if isinstance(result, BaseException):
        raise result
    return result, False


def parse_floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{name} = {text!r}: expected comma-separated numbers, e.g. 0.05,0.1") from None


def parse_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_grid(grid: str | None, pilot: Path | None, grid_size: int | None, score_col: str) -> Any:
    """--grid LOW:HIGH:K (uniform) or --pilot FILE --grid-size K (quantiles of a separate pilot sample)."""
    from cic.stats.calibration import quantile_grid, uniform_grid
    from cic.store.score_files import read_table

    if grid is not None and pilot is not None:
        raise UserError("give either --grid LOW:HIGH:K or --pilot FILE, not both")
    if grid is not None:
        parts = grid.split(":")
        if len(parts) != 3:
            raise UserError(f"--grid = {grid!r}: expected LOW:HIGH:K, e.g. 0:2.3:50")
        try:
            return uniform_grid(float(parts[0]), float(parts[1]), int(parts[2]))
        except ValueError as exc:
            raise UserError(f"--grid = {grid!r}: {exc}") from None
    if pilot is not None:
        if grid_size is None:
            raise UserError("--pilot needs --grid-size K (number of quantile thresholds)")
        frame = read_table(pilot)
        if score_col not in frame.columns:
            raise UserError(f"column {score_col!r} not found in {str(pilot)!r}")
        return quantile_grid(frame.get_column(score_col).to_numpy(), grid_size)
    return None


def load_pairs(file: Path, score_col: str, error_col: str, correct_col: str | None,
               stored: dict[str, str | None] | None = None, chosen: dict[str, str] | None = None
               ) -> tuple[Any, Any]:
    """(scores, errors) from a Parquet/CSV/JSON-lines table (one group of a long table, by --model/--dataset/
    --estimator/--criterion), an evaluation output (lm-eval, inspect-ai, HELM), or a pipeline DuckDB file."""
    from cic.store.score_files import group_pairs

    if file.suffix == ".duckdb":
        if chosen is not None:
            chosen.update({k: v for k, v in (stored or {}).items() if v})
        return load_stored_pairs(file, stored or {})
    return group_pairs(file, stored or {}, score_col=score_col, error_col=error_col, correct_col=correct_col,
                       chosen=chosen)


def load_stored_pairs(db: Path, stored: dict[str, str | None]) -> tuple[Any, Any]:
    """The (score, error) pairs of one stored group: --model, --dataset, --estimator, --criterion name it."""
    from cic.store import Store

    missing = [f"--{k.replace('_', '-')}" for k in ("model", "dataset", "estimator", "criterion") if not stored.get(k)]
    if missing:
        raise UserError(f"{str(db)!r} is a DuckDB store: name the group with {', '.join(missing)}")
    if not db.exists():
        raise UserError(f"FILE = {str(db)!r}: no such file")
    with Store.open(db, read_only=True, wait_s=READ_WAIT_S, waiting=say_waiting) as store:
        pairs = store.calibration_frame(stored["model"], stored["dataset"], stored["estimator"],
                                        stored["criterion"], run_key=stored.get("run_key"), allow_partial=True)
    return pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy()


def load_stored_judged(db: Path, stored: dict[str, str | None], judge: str, human: str) -> tuple[Any, ...]:
    """(scores, judge errors, people's errors, NaN where none labelled, ids) of one stored group, the criteria `judge`
    (e.g. ingested `correct:judge`) and `human` naming the two labellers."""
    from cic.store import Store
    from cic.store.score_files import judged_pairs

    missing = [f"--{k.replace('_', '-')}" for k in ("model", "dataset", "estimator") if not stored.get(k)]
    if missing:
        raise UserError(f"{str(db)!r} is a DuckDB store: name the group with {', '.join(missing)}")
    if stored.get("criterion"):
        raise UserError(f"--criterion {stored['criterion']!r}: --judge-col and --human-col name the two criteria; "
                        "leave --criterion out")
    if not db.exists():
        raise UserError(f"FILE = {str(db)!r}: no such file")
    with Store.open(db, read_only=True, wait_s=READ_WAIT_S, waiting=say_waiting) as store:
        frames = [store.calibration_frame(stored["model"], stored["dataset"], stored["estimator"], criterion,
                                          run_key=stored.get("run_key"), allow_partial=True)
                  for criterion in (judge, human)]
    return judged_pairs(*frames)


ModelOpt = Annotated[str | None, typer.Option("--model", help="The group to read from a long table, an evaluation "
                                                            "output or stored results (FILE.duckdb): its model.")]
DatasetOpt = Annotated[str | None, typer.Option("--dataset", help="The group to read: its dataset.")]
EstimatorOpt = Annotated[str | None, typer.Option("--estimator", help="The group to read: its estimator, e.g. "
                                                                      "'semantic_entropy\\[embedding:0.9]'.")]
CriterionOpt = Annotated[str | None, typer.Option("--criterion", help="The group to read: its criterion, e.g. "
                                                                      "'similarity[0.6]'.")]
RunKeyOpt = Annotated[str | None, typer.Option("--run-key", help="Stored results: choose among several runs.")]
ScoreCol = Annotated[str, typer.Option("--score-col", help="Column with the uncertainty score (lower = surer).")]
ErrorCol = Annotated[str, typer.Option("--error-col", help="Column with 1 where the answer is wrong.")]
CorrectCol = Annotated[str | None, typer.Option("--correct-col",
                                                help="Use a column with 1 where the answer is right instead.")]
Delta = Annotated[float, typer.Option("--delta", help="Allowed probability that the guarantee fails.")]
def search_choices() -> str:
    """Every registered search with the guarantee it carries (and the default), for help texts."""
    from cic.stats.searches import DEFAULT_SEARCH, SEARCHES

    return " | ".join(f"{s.name} ({'default, ' if s.name == DEFAULT_SEARCH else ''}{s.short_guarantee}"
                      f"{', needs --grid' if s.needs_grid else ''})" for s in SEARCHES.values())


def arena_choices() -> str:
    """Every method of the risk-control arena, for help texts."""
    from cic.reports.arena import METHODS

    return " | ".join(METHODS)


def bound_choices() -> str:
    """Every registered bound's name, for help texts."""
    from cic.stats.bounds import BOUND_NAMES

    return " | ".join(BOUND_NAMES)


Search = Annotated[str, typer.Option("--search", help=search_choices())]
BoundOpt = Annotated[str, typer.Option("--bound", help=bound_choices())]
GridOpt = Annotated[str | None, typer.Option("--grid", help="Uniform grid LOW:HIGH:K fixed in advance.")]
PilotOpt = Annotated[Path | None, typer.Option("--pilot", help="Pilot file whose score quantiles form the grid.")]
GridSize = Annotated[int | None, typer.Option("--grid-size", help="Number of pilot quantiles.")]
NMin = Annotated[int | None, typer.Option("--n-min", help="fallback / geometric / fixed_sequence / multistart: "
                                                         "no test below this accepted count.")]
Start = Annotated[float | None, typer.Option("--start", help="fallback / geometric / fixed_sequence / multistart: "
                                                            "no test below this threshold.")]
Alphas = Annotated[str, typer.Option("--alphas", help="Comma-separated risk levels.")]
Bounds = Annotated[str, typer.Option("--bounds", help=f"Comma-separated bounds: {bound_choices()}.")]
Searches = Annotated[str, typer.Option("--search", help=f"Comma-separated searches: {search_choices()}.")]
NSplits = Annotated[int, typer.Option("--n-splits", help="Random calibration/test splits.")]
CalFraction = Annotated[float, typer.Option("--cal-fraction", help="Share of items used to calibrate.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random splits (same seed, same splits).")]


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)



def parse_ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{name} = {text!r}: expected comma-separated integers, e.g. 200,1000") from None


def per_file(values: list[str] | None, n_files: int, name: str) -> list[str | None]:
    """A label given once applies to every file; given once per file, in file order."""
    if not values:
        return [None] * n_files
    if len(values) == 1:
        return values * n_files
    if len(values) != n_files:
        raise UserError(f"--{name} was given {len(values)} times for {n_files} files: give it once (all files) "
                         "or once per file")
    return list(values)


def mlflow_client(run_id: str) -> Any:
    """A tracking client for an existing run (MLFLOW_TRACKING_URI), checked before any work is done."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    try:
        client.get_run(run_id)
    except MlflowException as exc:
        raise UserError(f"--mlflow-run-id = {run_id!r}: {exc.message}") from None
    return client


LabelOpt = Annotated[list[str] | None, typer.Option(help="Label for files without this column: once for all files "
                                                         "or once per file.")]


DbOpt = Annotated[Path, typer.Option("--db", help="DuckDB file of the store.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing file that cic did not write (a "
                                                        "database, Parquet, CSV or JSON file; never an input of the "
                                                        "command, a device or a directory).")]


_GATE_COMMAND = re.compile(r"`cic gate (\w+)((?: [0-9a-f]{6,})?)([^`]*)`")
_ADVISED_STORE: ContextVar[str | None] = ContextVar("cic_advised_store", default=None)


def on_store(text: str, db: str | Path | None) -> str:
    """Advice as it runs from here: each `cic gate …` command in `text` that names no store gets `--db db` when
    `db` is not the default store of the working directory (stored advice names no store: the surface adds it)."""
    from cic.pipeline.gates.serving_state import is_default_store

    if is_default_store(db):
        return text
    return _GATE_COMMAND.sub(lambda m: m[0] if "--db" in m[0] else
                             f"`cic gate {m[1]}{m[2]} --db {shlex.quote(str(db))}{m[3]}`", text)


def advise_on(db: str | Path | None) -> None:
    """From here on, this command's printed messages name `db` in each `cic gate …` command (`on_store`): the
    store it read, so that what a person copies runs as printed. `friendly_errors` sets it from --db."""
    if db is not None:
        _ADVISED_STORE.set(str(db))


def _on_advised_store(message: Text) -> Text:
    """`message` with `on_store` applied for the store this command read, its styles kept."""
    db = _ADVISED_STORE.get()
    if db is None:
        return message
    for match in reversed(list(_GATE_COMMAND.finditer(message.plain))):
        changed = on_store(match[0], db)
        if changed != match[0]:
            message = message[:match.start()] + Text(changed) + message[match.end():]
    return message
