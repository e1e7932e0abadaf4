"""A precomputed long (score, error) table as stored runs, so `cic log FILE` logs it to MLflow in the pipeline's
layout (a run per model × dataset × estimator × criterion with its per-α table) through the
same calibrate and log tasks: a table from elsewhere — the committed real example included — compares in MLflow
side by side with `cic run`'s results."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import polars as pl

from cic.errors import UserError
from cic.store.score_files import GROUP_KEYS, check_long_frame

if TYPE_CHECKING:
    from cic.store import Store

TABLE_SPLIT = "table"
TABLE_PROMPT = "table"


def _evaluated_by(part: pl.DataFrame) -> dict[str, str]:
    """{"evaluated_by": "lm-eval 0.4.13"} for rows a harness evaluated (the table's `source` column), else {}."""
    if "source" not in part.columns:
        return {}
    sources = sorted(set(part.get_column("source").drop_nulls().to_list()))
    return {"evaluated_by": ", ".join(sources)} if sources else {}


def store_long_table(store: Store, frame: pl.DataFrame, *, source: str, digest: str) -> list[str]:
    """Store the table's groups as runs (one per model × dataset when questions are identified, else one per
    group); returns their run keys. `digest` (of the file) keys the runs: the same table is the same runs."""
    frame = check_long_frame(frame, source)
    identified = "question_id" in frame.columns
    if not identified:  # rows of different groups cannot be matched: each group is its own run
        frame = frame.with_columns(question_id=pl.format("row{}", pl.int_range(pl.len()).over(*GROUP_KEYS)))
    clash = frame.group_by("model", "dataset", "criterion", "question_id").agg(pl.col("error").n_unique()) \
        .filter(pl.col("error") > 1)
    if identified and clash.height:
        row = clash.row(0, named=True)
        raise UserError(f"{source}: question_id {row['question_id']!r} of model {row['model']!r}, dataset "
                         f"{row['dataset']!r} is both right and wrong under criterion {row['criterion']!r} (rows of "
                         "different estimators disagree); one question has one label per criterion")
    unit = ["model", "dataset"] if identified else list(GROUP_KEYS)
    keys, now = [], datetime.now(UTC)
    for values, part in frame.group_by(unit, maintain_order=True):
        named = dict(zip(unit, values, strict=True))
        shape = {"source": "table", "digest": digest, **{k: v for k, v in named.items() if k in ("estimator",
                                                                                                  "criterion")},
                 **_evaluated_by(part)}
        run_key = store.register_run(named["model"], named["dataset"], TABLE_SPLIT, TABLE_PROMPT, shape)
        scores = part.select(pl.lit(run_key).alias("run_key"), "question_id", "estimator", pl.col("score")
                             .alias("value")).unique(["question_id", "estimator"], keep="last")
        labels = part.select(pl.lit(run_key).alias("run_key"), "question_id", "criterion",
                             (pl.col("error") == 0).alias("aligned"), (1 - pl.col("error")).cast(pl.Float64)
                             .alias("value"), pl.lit(now).alias("created_at")).unique(["question_id", "criterion"])
        with store.transaction():
            store.upsert("scores", scores)
            store.upsert("labels", labels)
        keys.append(run_key)
    return keys
