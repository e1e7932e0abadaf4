"""Load a registered dataset as a polars DataFrame in the QUESTIONS layout (`cic.schema.QUESTIONS`).

`load_questions("commonsense_qa")` reads the bundled offline sample; `source=` takes "hub", a hub id, or a
local JSONL/Parquet file or directory in the hub's column layout. Every record is checked (a missing field is
reported with its row and name), question ids must be unique, and `limit`/`seed` subsample deterministically.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cic import schema
from cic.data.records import RecordError
from cic.data.registry import DATASETS, DatasetRegistry
from cic.data.sources import read_records
from cic.errors import UserError

if TYPE_CHECKING:
    import polars as pl

_PARSED_FIELDS = set(schema.QUESTIONS.columns) - {"dataset", "split"}


def load_questions(dataset: str, source: str | Path | None = None, *, split: str = "validation",
                   limit: int | None = None, seed: int | None = None,
                   registry: DatasetRegistry = DATASETS) -> pl.DataFrame:
    """Questions of `dataset` from `source` (default: the bundled sample or the dataset's own path).

    `limit` keeps that many rows: the first ones in source order, or with `seed` a seeded random subset
    (kept in source order). The result conforms to `schema.QUESTIONS`.
    """
    import polars as pl

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"limit = {limit!r}: must be a positive integer")
    if not split or not isinstance(split, str):
        raise UserError(f"split = {split!r}: must be a non-empty string")
    spec = registry.get(dataset)
    records = read_records(spec, source, split)
    rows: list[dict[str, Any]] = []
    for record, location in zip(records.rows, records.locations, strict=True):
        try:
            rows.append(spec.parse(record))
        except RecordError as exc:
            ident = record.get("question_id", record.get("id"))
            named = f" (id {ident!r})" if ident is not None else ""
            raise UserError(f"{dataset}: {location}{named}: {exc}") from None
    if set(rows[0]) != _PARSED_FIELDS:
        raise UserError(f"{dataset}: the record parser returned fields {sorted(rows[0])}; expected "
                         f"{sorted(_PARSED_FIELDS)}")
    _check_unique_ids(rows, records.locations, dataset)
    keep = _subsample(len(rows), limit, seed)
    frame = pl.DataFrame([rows[i] for i in keep], schema={c: schema.QUESTIONS.columns[c] for c in _PARSED_FIELDS})
    frame = frame.with_columns(pl.lit(spec.name).alias("dataset"), pl.lit(split).alias("split"))
    return schema.conform(frame, schema.QUESTIONS)


def _check_unique_ids(rows: list[dict[str, Any]], locations: list[str], dataset: str) -> None:
    first_seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        qid = row["question_id"]
        if qid in first_seen:
            raise UserError(f"{dataset}: duplicate question_id {qid!r} at {locations[first_seen[qid]]} and "
                             f"{locations[i]}; question ids must be unique")
        first_seen[qid] = i


def _subsample(n: int, limit: int | None, seed: int | None) -> np.ndarray:
    """Row indices to keep, in source order: all, the first `limit`, or a seeded random `limit` of them — the
    first `limit` of one seeded permutation, so a larger limit extends the sample a smaller one drew."""
    if limit is None or limit >= n:
        return np.arange(n)
    if seed is None:
        return np.arange(limit)
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])
