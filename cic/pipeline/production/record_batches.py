"""A file of production records read in bounded batches, so a month of traffic never sits in memory at once:
Parquet by row group slices (pyarrow), CSV by blocks (pyarrow's streaming reader, every column as text), JSONL
by lines (a line that is not JSON is named by its number).

    for first_record, frame in record_batches("traffic.jsonl", rows=100_000):   # first_record: 1-based
        ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from cic.errors import UserError

SUFFIXES = (".parquet", ".pq", ".csv", ".jsonl", ".ndjson")


def _unreadable(path: Path, kind: str, exc: Exception) -> UserError:
    return UserError(f"file = {str(path)!r}: cannot be read as {kind}: {' '.join(str(exc).split())[:200]}")


def _parquet(path: Path, rows: int) -> Iterator[pl.DataFrame]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        for batch in handle.iter_batches(batch_size=rows):
            yield pl.from_arrow(batch)  # type: ignore[misc]
    except (OSError, ValueError) as exc:
        raise _unreadable(path, "parquet", exc) from None
    except Exception as exc:  # pyarrow's ArrowInvalid and friends
        raise _unreadable(path, "parquet", exc) from None


def _csv(path: Path, rows: int) -> Iterator[pl.DataFrame]:
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise UserError(f"file = {str(path)!r}: has no header line")
    if len(set(header)) != len(header):
        repeated = sorted({c for c in header if header.count(c) > 1})
        raise UserError(f"file = {str(path)!r}: column(s) {', '.join(map(repr, repeated))} appear more than once "
                         "in the header")
    try:
        reader = pacsv.open_csv(
            path, read_options=pacsv.ReadOptions(block_size=max(rows * 256, 1 << 20)),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                                 strings_can_be_null=True, null_values=[""]))  # only empty: a
        # "nan" or "NA" score is a value to refuse (README), not a score the estimator did not give
        for batch in reader:
            yield pl.from_arrow(batch)  # type: ignore[misc]
    except Exception as exc:  # pyarrow's ArrowInvalid names the row it could not parse
        raise _unreadable(path, "csv", exc) from None


def _jsonl(path: Path, rows: int) -> Iterator[pl.DataFrame]:
    with path.open("rb") as handle:
        line_number, lines = 0, []
        for line in handle:
            line_number += 1
            if line.strip():
                lines.append((line_number, line))
            if len(lines) >= rows:
                yield _parse_lines(path, lines)
                lines = []
        if lines:
            yield _parse_lines(path, lines)


def _parse_lines(path: Path, lines: list[tuple[int, bytes]]) -> pl.DataFrame:
    """One batch of JSON lines (polars parses it; when it cannot, the first line that is not a JSON object is
    named by its number)."""
    import io

    try:
        return pl.read_ndjson(io.BytesIO(b"".join(line if line.endswith(b"\n") else line + b"\n"
                                                  for _, line in lines)), infer_schema_length=None)
    except Exception as exc:  # polars raises several types; find the line to name
        failure = exc
    for number, line in lines:
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise UserError(f"file = {str(path)!r}: line {number} is not JSON ({exc.args[0] if exc.args else exc}): "
                             f"{line[:80].decode('utf-8', 'replace')!r}") from None
        if not isinstance(value, dict):
            raise UserError(f"file = {str(path)!r}: line {number} is not a JSON object: "
                             f"{line[:80].decode('utf-8', 'replace')!r}")
    raise _unreadable(path, "jsonl", failure)


def record_batches(path: Path, rows: int) -> Iterator[tuple[int, pl.DataFrame]]:
    """(number of the batch's first record, 1-based; the batch) for each batch of at most `rows` records."""
    suffix = path.suffix.lower()
    reader = _csv if suffix == ".csv" else _jsonl if suffix in (".jsonl", ".ndjson") else _parquet
    first = 1
    for frame in reader(path, rows):
        if frame.height:
            yield first, frame
            first += frame.height
