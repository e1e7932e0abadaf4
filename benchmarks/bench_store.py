"""Speed of the DuckDB store, each figure against a baseline timed in the same run.

    .venv/bin/python benchmarks/bench_store.py [--rows 1000000] [--row-by-row 10000]

1. `Store.upsert` of 10^6 score rows into an empty store (one Arrow batch), then the same rows again (every
   key conflicts: the idempotent rewrite), then `Store.read("scores")` back as polars.
2. Baseline: the same table filled row by row, one parameterised INSERT ... ON CONFLICT per row (what a
   naive writer does), for 10^4 rows, in autocommit mode (each row its own commit) and inside one
   transaction. Printed: rows/s of each and the ratios bulk / row-by-row.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cic import schema  # noqa: E402
from cic.store.database import Store, create_table_sql  # noqa: E402


def score_rows(n: int, seed: int = 0) -> pl.DataFrame:
    """n score rows shaped like a real run: 8 run keys x n/8 questions, two estimators."""
    rng = np.random.default_rng(seed)
    index = np.arange(n)
    return pl.DataFrame({
        "run_key": pl.Series([f"{k:016x}" for k in range(8)])[index % 8],
        "question_id": pl.Series(index // 16).cast(pl.String).str.pad_start(8, "0"),
        "estimator": pl.Series(["semantic_entropy[embedding:0.9]", "predictive_entropy"])[(index // 8) % 2],
        "value": rng.random(n),
    })


def timed(label: str, rows: int, func) -> float:
    start = time.perf_counter()
    func()
    seconds = time.perf_counter() - start
    print(f"{label:<48} {rows:>9,} rows  {seconds:8.3f} s  {rows / seconds:>12,.0f} rows/s")
    return rows / seconds


def row_by_row(path: Path, frame: pl.DataFrame, *, one_transaction: bool) -> None:
    """The baseline: one parameterised upsert statement per row (autocommit, or all in one transaction)."""
    con = duckdb.connect(str(path))
    try:
        con.execute(create_table_sql(schema.SCORES))
        sql = ("INSERT INTO scores VALUES (?, ?, ?, ?) ON CONFLICT (run_key, question_id, estimator) "
               "DO UPDATE SET value = excluded.value")
        if one_transaction:
            con.begin()
        for row in frame.iter_rows():
            con.execute(sql, list(row))
        if one_transaction:
            con.commit()
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-by-row", type=int, default=10_000)
    args = parser.parse_args()
    frame = score_rows(args.rows)
    small = frame.head(args.row_by_row)
    with tempfile.TemporaryDirectory() as tmp:
        with Store.open(Path(tmp) / "bulk.duckdb") as store:
            bulk = timed("bulk upsert, empty table", args.rows, lambda: store.upsert("scores", frame))
            rewrite = timed("bulk upsert, same keys again (idempotent)", args.rows,
                            lambda: store.upsert("scores", frame))
            read = timed("read back as polars (ordered by key)", args.rows, lambda: store.read("scores"))
            timed("read back as polars (storage order)", args.rows, lambda: store.read("scores", ordered=False))
            assert store.count("scores") == args.rows
        with Store.open(Path(tmp) / "small.duckdb") as store:
            small_bulk = timed("bulk upsert, empty table", args.row_by_row, lambda: store.upsert("scores", small))
        single = timed("row by row, autocommit (baseline)", args.row_by_row,
                       lambda: row_by_row(Path(tmp) / "rows.duckdb", small, one_transaction=False))
        single_tx = timed("row by row, one transaction", args.row_by_row,
                          lambda: row_by_row(Path(tmp) / "rows_tx.duckdb", small, one_transaction=True))
    print(f"\nbulk upsert of {args.row_by_row:,} rows vs row-by-row of the same rows: {small_bulk / single:,.0f}x "
          f"(autocommit), {small_bulk / single_tx:,.0f}x (one transaction)")
    print(f"idempotent rewrite: {rewrite / bulk:.2f}x the rate of the first write; read: {read / bulk:.0f}x")


if __name__ == "__main__":
    main()
