"""Completing a cut-off ingest against a fresh ingest of the same file, in the same run.

    .venv/bin/python benchmarks/bench_ingest_completion.py [--records 1200000] [--streams 500] [--cut-at 2]

A Parquet file of R records (S streams, two scores, labels) is ingested three ways, each into its own store:
fresh (the baseline); cut off by a full disk at commit step `--cut-at` and then completed by rerunning
`cic ingest FILE` (from the staged data the journal keeps); and the same cut-off completed after its staged data
was removed (the whole file read, checked and staged again; the steps the journal counts as committed skipped).
Target: completion ≤ 1.5× the fresh ingest, both ways.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cic.pipeline.production.ingest as ingest  # noqa: E402
import cic.pipeline.production.ingest_journal as journal  # noqa: E402
from cic.store import Store  # noqa: E402

NOW = datetime(2027, 1, 1, tzinfo=UTC)


def traffic(records: int, streams: int, path: Path) -> Path:
    """R labelled records over S streams with two score columns."""
    rng = np.random.default_rng(0)
    score = rng.random(records)
    pl.DataFrame({
        "model": "m", "stream": [f"s{i}" for i in rng.integers(0, streams, records)],
        "question_id": [f"q{i}" for i in range(records)], "question": "?", "answer": "a",
        "timestamp": pl.datetime_range(NOW - timedelta(days=30), NOW - timedelta(days=1), interval="1s",
                                       time_zone="UTC", eager=True).head(records),
        "score:semantic_entropy": score, "score:predictive_entropy": score * 2,
        "correct": rng.random(records) >= 0.02 + 0.5 * score}).write_parquet(path)
    return path


def cut_off(db: Path, path: Path, at: int) -> float:
    """An ingest that fails at commit step `at` (a full disk); returns its seconds."""
    real, calls = journal.write_step, []

    def failing(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == at:
            raise OSError("No space left on device")
        real(*args, **kwargs)

    journal.write_step = failing
    start = time.perf_counter()
    try:
        with Store.open(db) as store:
            ingest.ingest_file(store, path, now=NOW)
    except OSError:
        pass
    finally:
        journal.write_step = real
    return time.perf_counter() - start


def timed_ingest(db: Path, path: Path) -> float:
    start = time.perf_counter()
    with Store.open(db) as store:
        ingest.ingest_file(store, path, now=NOW)
        assert ingest.unfinished_ingests(store) == []
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_200_000)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--cut-at", type=int, default=2, help="the commit step that fails (1 = the first)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = traffic(args.records, args.streams, work / "traffic.parquet")
        fresh = timed_ingest(work / "fresh.duckdb", path)
        first = cut_off(work / "staged.duckdb", path, args.cut_at)
        staged = timed_ingest(work / "staged.duckdb", path)
        cut_off(work / "gone.duckdb", path, args.cut_at)
        with Store.open(work / "gone.duckdb") as store:
            shutil.rmtree(ingest.staging_dir(store, ingest.file_digest(path)))
        gone = timed_ingest(work / "gone.duckdb", path)
        with Store.open(work / "fresh.duckdb", read_only=True) as a, \
                Store.open(work / "staged.duckdb", read_only=True) as b:
            assert a.counts()["labels"] == b.counts()["labels"] == args.records
    print(f"| ingest of {args.records:,} records (cut off at step {args.cut_at}) | seconds | × fresh |")
    print("|---|---|---|")
    print(f"| fresh ingest | {fresh:.1f} | 1.00 |")
    print(f"| the cut-off attempt | {first:.1f} | {first / fresh:.2f} |")
    print(f"| completion from staged data (rerun `cic ingest FILE` or `--complete ID`) | {staged:.1f} | "
          f"{staged / fresh:.2f} |")
    print(f"| completion with staged data gone (the file read and staged again, committed steps skipped) | "
          f"{gone:.1f} | {gone / fresh:.2f} |")
    print(f"target: completion ≤ 1.5× fresh — {'met' if max(staged, gone) <= 1.5 * fresh else 'NOT met'}")


if __name__ == "__main__":
    main()
