"""Read precomputed (score, error) tables from Parquet or CSV files, with errors that name file, column and row."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cic._validation import as_errors, as_scores

if TYPE_CHECKING:
    import polars as pl

SUFFIXES = (".parquet", ".pq", ".csv")


def read_table(path: str | Path) -> pl.DataFrame:
    """Load a Parquet or CSV file as a polars DataFrame."""
    import polars as pl

    p = Path(path)
    if not p.exists():
        raise ValueError(f"file = {str(p)!r}: does not exist")
    if p.is_dir():
        raise ValueError(f"file = {str(p)!r}: is a directory; give a .parquet or .csv file")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"file = {str(p)!r}: unsupported type {suffix or '(none)'!r}; use one of "
                         f"{', '.join(SUFFIXES)}")
    try:
        return pl.read_csv(p) if suffix == ".csv" else pl.read_parquet(p)
    except Exception as exc:  # polars raises several exception types for unreadable files
        raise ValueError(f"file = {str(p)!r}: cannot be read as {suffix[1:]}: {exc}") from None


def _column(frame: pl.DataFrame, name: str, source: str) -> np.ndarray:
    if name not in frame.columns:
        raise ValueError(f"column {name!r} not found in {source}; columns are: {', '.join(frame.columns)}")
    col = frame.get_column(name)
    if col.null_count():
        row = int(np.flatnonzero(col.is_null().to_numpy())[0])
        raise ValueError(f"column {name!r} in {source} has a missing value at row {row}")
    return col.to_numpy()


def score_error_arrays(frame: pl.DataFrame, *, score_col: str = "score", error_col: str | None = "error",
                       correct_col: str | None = None, source: str = "table") -> tuple[np.ndarray, np.ndarray]:
    """Scores and 0/1 errors from a frame; `correct_col` (1 = right answer) is the alternative to `error_col`."""
    scores = as_scores(_column(frame, score_col, source), f"column {score_col!r}")
    if correct_col is not None:
        correct = as_errors(_column(frame, correct_col, source), f"column {correct_col!r}")
        errors = 1 - correct
    elif error_col is not None:
        errors = as_errors(_column(frame, error_col, source), f"column {error_col!r}")
    else:
        raise ValueError("give error_col (1 = wrong answer) or correct_col (1 = right answer)")
    return scores, errors.astype(np.int8)
