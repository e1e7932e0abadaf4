"""Read precomputed (score, error) tables from Parquet, CSV or JSON-lines files and check long multi-group score
frames.

Errors name the file, column, row and value.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cic.errors import UserError
from cic.stats._validation import as_errors, as_scores

if TYPE_CHECKING:
    import polars as pl

    from cic.store.harness import Harness

SUFFIXES = (".parquet", ".pq", ".csv", ".jsonl", ".ndjson")
JSONL = (".jsonl", ".ndjson")


def input_file(path: str | Path, suffixes: tuple[str, ...]) -> Path:
    """An existing file with one of the suffixes, or an error naming the path and what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"file = {str(p)!r}: does not exist")
    if p.is_dir():
        raise UserError(f"file = {str(p)!r}: is a directory; give a {' or '.join(suffixes)} file")
    if p.suffix.lower() not in suffixes:
        raise UserError(f"file = {str(p)!r}: unsupported type {p.suffix.lower() or '(none)'!r}; use one of "
                         f"{', '.join(suffixes)}")
    return p


def read_table(path: str | Path) -> pl.DataFrame:
    """Load a Parquet, CSV or JSON-lines file (one object per line, as `cic ingest` reads) as a polars DataFrame."""
    import polars as pl

    p = input_file(path, SUFFIXES)
    suffix = p.suffix.lower()
    if suffix in JSONL:
        return _read_jsonl(p)
    try:
        return pl.read_csv(p) if suffix == ".csv" else pl.read_parquet(p)
    except Exception as exc:  # polars raises several exception types for unreadable files
        raise UserError(f"file = {str(p)!r}: cannot be read as {suffix[1:]}: {exc}") from None


def _read_jsonl(p: Path) -> pl.DataFrame:
    """A JSON-lines file; a line that is not a JSON object is named by its number."""
    import json

    import polars as pl

    try:
        return pl.read_ndjson(p, infer_schema_length=None)
    except Exception as exc:  # find the line polars could not take, for the message
        with p.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    if not isinstance(json.loads(line), dict):
                        raise ValueError("not a JSON object")
                except ValueError as why:
                    raise UserError(f"file = {str(p)!r}: line {number} is not a JSON object ({why})") from None
        raise UserError(f"file = {str(p)!r}: cannot be read as JSON lines: {str(exc).splitlines()[0]}") from None


def _column(frame: pl.DataFrame, name: str, source: str) -> np.ndarray:
    if name not in frame.columns:
        if frame.height and (harness := _harness_of(frame)) is not None:
            path = source.strip("'")
            raise UserError(f"{source} is {harness.label} output, not a (score, error) table: convert it first "
                            f"with `cic convert {path} --out scores.parquet`")
        raise UserError(f"column {name!r} not found in {source}; columns are: {', '.join(frame.columns)}")
    col = frame.get_column(name)
    if col.null_count():
        row = int(np.flatnonzero(col.is_null().to_numpy())[0])
        raise UserError(f"column {name!r} in {source} has a missing value at row {row}")
    return col.to_numpy()


def _harness_of(frame: pl.DataFrame) -> Harness | None:
    """The harness whose output a table's first row is (`cic.store.harness`), None for any other table."""
    from cic.store.harness import which_harness

    return which_harness(frame.row(0, named=True))


def score_error_arrays(frame: pl.DataFrame, *, score_col: str = "score", error_col: str | None = "error",
                       correct_col: str | None = None, source: str = "table",
                       one_group: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Scores and 0/1 errors from a frame; `correct_col` (1 = right answer) is the alternative to `error_col`. With
    `one_group` (the frame is one calibration set) a question_id column must name each question once: a repeated
    question would count n times."""
    if one_group and "question_id" in frame.columns:
        ids = frame.get_column("question_id").cast(str)
        repeated = ids.is_duplicated()
        if repeated.any():
            rows = np.flatnonzero(repeated.to_numpy())
            first = ids[int(rows[0])]
            at = np.flatnonzero((ids == first).to_numpy())
            raise UserError(f"{source}: question_id {first!r} appears more than once (rows {at[0]} and {at[1]}; "
                            f"{int(repeated.sum())} rows repeat an id): each question is one calibration point — "
                            "drop or aggregate the repeats first")
    scores = as_scores(_column(frame, score_col, source), f"column {score_col!r}")
    if correct_col is not None:
        correct = as_errors(_column(frame, correct_col, source), f"column {correct_col!r}")
        errors = 1 - correct
    elif error_col is not None:
        errors = as_errors(_column(frame, error_col, source), f"column {error_col!r}")
    else:
        raise UserError("give error_col (1 = wrong answer) or correct_col (1 = right answer)")
    return scores, errors.astype(np.int8)


#: The columns that name one (score, error) table inside a long frame of several.
GROUP_KEYS: tuple[str, ...] = ("model", "dataset", "estimator", "criterion")


OPTIONAL_COLUMNS = ("question_id", "source")  # a long frame keeps them when a file has them
#: What the score cost on its question, in generations (the most likely answer included: 1 for a one-pass score,
#: 11 for one with ten samples, the drawn count for an adaptive one); kept, as a whole number >= 1, when present.
COST_COLUMN = "generations"


def _costs(frame: pl.DataFrame, source: str) -> np.ndarray:
    """The cost column as whole numbers >= 1; the error names the first row that is not."""
    import polars as pl

    raw = _column(frame, COST_COLUMN, source)
    values = pl.Series(raw).cast(pl.Float64, strict=False).to_numpy()
    bad = ~(np.isfinite(values) & (values >= 1) & (values == np.round(values)))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise UserError(f"column {COST_COLUMN!r} in {source} has {raw.tolist()[row]!r} at row {row}: generations a "
                        "question must be a whole number >= 1 (the most likely answer counts)")
    return values.astype(np.int64)


def check_long_frame(frame: pl.DataFrame, source: str = "table") -> pl.DataFrame:
    """Validate a long (score, error) frame with several groups; return its columns in order, error as Int8.

    Columns: model, dataset, estimator, criterion (strings naming the group), score (finite), error (0/1,
    1 = wrong), question_id optional (unique within a group when present), source optional (who evaluated the
    answers, e.g. "lm-eval 0.4.13": kept so reports and MLflow say where the table came from), generations
    optional (`COST_COLUMN`). Errors name column, row, value.
    """
    import polars as pl

    needed = (*GROUP_KEYS, "score", "error")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise UserError(f"{source} lacks column(s) {', '.join(missing)}; a long score table needs "
                         f"{', '.join(needed)} (question_id optional); columns are: {', '.join(frame.columns)}")
    if frame.height == 0:
        raise UserError(f"{source} has no rows")
    keep = [*needed, *(c for c in OPTIONAL_COLUMNS if c in frame.columns)]
    for name in keep:
        _column(frame, name, source)  # names the first missing value
    scores = as_scores(frame.get_column("score").to_numpy(), f"column 'score' in {source}")
    errors = as_errors(frame.get_column("error").to_numpy(), f"column 'error' in {source}")
    out = frame.select([pl.col(k).cast(pl.String) for k in keep if k not in ("score", "error")]).with_columns(
        score=pl.Series(scores), error=pl.Series(errors, dtype=pl.Int8))
    out = out.select(keep)
    if COST_COLUMN in frame.columns:
        out = out.with_columns(pl.Series(COST_COLUMN, _costs(frame, source)))
    if "question_id" in keep:
        dup = out.filter(pl.struct(*GROUP_KEYS, "question_id").is_duplicated())
        if dup.height:
            row = dup.row(0, named=True)
            raise UserError(f"{source}: question_id {row['question_id']!r} appears more than once for model "
                             f"{row['model']!r}, dataset {row['dataset']!r}, estimator {row['estimator']!r}, "
                             f"criterion {row['criterion']!r}")
    return out


def group_pairs(path: str | Path, wanted: dict[str, str | None], *, score_col: str = "score",
                error_col: str | None = "error", correct_col: str | None = None,
                chosen: dict[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, errors) of one calibration set: a plain table's rows, or the one group of a long table or of an
    evaluation output (`cic.store.harness`) that `wanted` (model, dataset, estimator, criterion) leaves; `chosen`,
    when given, is filled with that group's keys (a plain table's: its score column as the estimator)."""
    from cic.store.harness import harness_at

    p, source = Path(path), repr(str(path))
    harness = harness_at(p) if p.exists() else None
    frame = None if harness is not None else read_table(p)
    if frame is not None and not set(GROUP_KEYS) <= set(frame.columns):
        given = [f"--{key} {wanted[key]!r}" for key in GROUP_KEYS if wanted.get(key) is not None]
        if given:
            raise UserError(f"{', '.join(given)}: {source} is one table (no {', '.join(GROUP_KEYS)} columns) with "
                            "nothing to choose; leave the option out")
        if chosen is not None:
            chosen["estimator"] = score_col
        return score_error_arrays(frame, one_group=True, score_col=score_col, error_col=error_col,
                                  correct_col=correct_col, source=source)
    long = (check_long_frame(harness.read(p), source) if harness is not None else
            read_long_table(p, score_col=score_col, error_col=error_col, correct_col=correct_col))
    group = select_group(long, wanted, source)
    if chosen is not None and group.height:
        chosen.update({key: str(group.get_column(key)[0]) for key in GROUP_KEYS})
    return group.get_column("score").to_numpy(), group.get_column("error").to_numpy()


def select_group(long: pl.DataFrame, wanted: dict[str, str | None], source: str) -> pl.DataFrame:
    """The rows of the one (model, dataset, estimator, criterion) group the given values leave; a value the table
    lacks, or several groups left, is one line naming the choices."""
    import polars as pl

    for key in GROUP_KEYS:
        value = wanted.get(key)
        if value is None:
            continue
        held = sorted(set(long.get_column(key)))
        if value not in held:
            raise UserError(f"--{key} = {value!r}: not in {source} (it holds {', '.join(held)})")
        long = long.filter(pl.col(key) == value)
    groups = long.select(GROUP_KEYS).unique(maintain_order=True)
    if groups.height > 1:
        choices = "; ".join(f"--{key} {' | '.join(sorted(set(groups.get_column(key))))}" for key in GROUP_KEYS
                            if groups.get_column(key).n_unique() > 1)
        raise UserError(f"{source} holds {groups.height} score tables: choose one with {choices}")
    return long


def read_long_table(path: str | Path, *, labels: dict[str, str | None] | None = None, score_col: str = "score",
                    error_col: str | None = "error", correct_col: str | None = None) -> pl.DataFrame:
    """One file as a long score frame (see `check_long_frame`).

    Group columns come from the file or from `labels` (e.g. {"model": "qwen-3b"}), never both: a label for a
    column the file already has is refused, so nothing is silently overwritten. Without either, estimator
    defaults to the score column's name and criterion to the error (or correct) column's name.
    """
    import polars as pl

    from cic.store.harness import harness_at

    source = repr(str(path))
    harness = harness_at(Path(path)) if Path(path).exists() else None
    if harness is not None:  # an evaluation output names its own groups
        given = [f"--{key}" for key, value in (labels or {}).items() if value is not None]
        if given:
            raise UserError(f"{source} is {harness.label} output, which names its own groups: drop {', '.join(given)}")
        return check_long_frame(harness.read(Path(path)), source)
    frame = read_table(path)
    scores, errors = score_error_arrays(frame, score_col=score_col, error_col=error_col, correct_col=correct_col,
                                        source=source)
    defaults = {"estimator": score_col, "criterion": correct_col if correct_col is not None else error_col}
    columns: dict[str, pl.Series] = {}
    for key in GROUP_KEYS:
        given = (labels or {}).get(key)
        if key in frame.columns and given is not None:
            raise UserError(f"{source} already has a column {key!r}; drop the --{key} label or the column")
        if key in frame.columns:
            columns[key] = frame.get_column(key).cast(pl.String)
        elif given is not None or defaults.get(key) is not None:
            columns[key] = pl.Series(key, [given if given is not None else defaults[key]] * frame.height)
        else:
            raise UserError(f"{source} has no column {key!r}: label it with --{key} NAME (or add the column)")
    for optional in OPTIONAL_COLUMNS:
        if optional in frame.columns:
            columns[optional] = frame.get_column(optional).cast(pl.String)
    if COST_COLUMN in frame.columns:
        columns[COST_COLUMN] = frame.get_column(COST_COLUMN)
    long = pl.DataFrame({**columns, "score": scores, "error": errors})
    return check_long_frame(long, source)


Judged = tuple[np.ndarray, np.ndarray, np.ndarray, list[str] | None]


def judged_pairs(judge: pl.DataFrame, human: pl.DataFrame) -> Judged:
    """(scores, judge errors, people's errors with NaN where none labelled, question ids) from two (question_id,
    score, error) frames of one group: the judge's questions are the calibration set, people's joined on id."""
    import polars as pl

    joined = judge.join(human.select("question_id", pl.col("error").alias("human")), on="question_id", how="left")
    human_errors = joined.get_column("human").cast(pl.Float64).fill_null(float("nan")).to_numpy()
    return (joined.get_column("score").to_numpy(), joined.get_column("error").to_numpy(), human_errors,
            joined.get_column("question_id").cast(pl.String).to_list())


def judged_columns(path: str | Path, score_col: str, judge_col: str, human_col: str,
                   wanted: dict[str, str | None]) -> Judged:
    """(scores, judge errors, people's errors with NaN where no person labelled, question ids or None): of a plain
    table (its question_id column, when it has one, fixes the people's betting order), the columns
    `judge_col` (every row) and `human_col` (empty where nobody labelled), 0/1 or booleans, 1 = wrong; of a long
    table, the criteria of those names in the one (model, dataset, estimator) group `wanted` leaves."""
    p, source = Path(path), repr(str(path))
    frame = read_table(p)
    if set(GROUP_KEYS) <= set(frame.columns):
        if wanted.get("criterion") is not None:
            raise UserError(f"--criterion {wanted['criterion']!r}: --judge-col and --human-col name the two criteria "
                            "of a long table; leave --criterion out")
        long = check_long_frame(frame, source)
        held = sorted(set(long.get_column("criterion")))
        for criterion in (judge_col, human_col):
            if criterion not in held:
                raise UserError(f"criterion {criterion!r}: not in {source} (it holds {', '.join(held)})")
        if "question_id" not in long.columns:
            raise UserError(f"{source}: a long table needs question_id to join the judge's and people's labels")
        groups = [select_group(long, {**wanted, "criterion": c}, source) for c in (judge_col, human_col)]
        return judged_pairs(*(g.select("question_id", "score", "error") for g in groups))
    given = [f"--{key} {value!r}" for key, value in wanted.items() if value is not None]
    if given:
        raise UserError(f"{', '.join(given)}: {source} is one table (a row per question) with nothing to choose; "
                        "leave the option out")
    scores, judge = score_error_arrays(frame, one_group=True, score_col=score_col, error_col=judge_col, source=source)
    if human_col not in frame.columns:
        raise UserError(f"--human-col = {human_col!r}: no such column in {source}; columns are: "
                        f"{', '.join(frame.columns)}")
    people = frame.get_column(human_col)
    labelled = people.is_not_null().to_numpy()
    human = np.full(frame.height, np.nan)
    if labelled.any():
        human[labelled] = as_errors(people.filter(people.is_not_null()), f"column {human_col!r}")
    ids = frame.get_column("question_id").cast(str).to_list() if "question_id" in frame.columns else None
    return scores, judge, human, ids
