"""Production scale: recalibrating thousands of ingested streams in one pass, and ingesting a month of traffic
with bounded memory — each figure against a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_production_scale.py recalibration [--streams 5000] [--per-week 40]
    .venv/bin/python benchmarks/bench_production_scale.py ingest [--records 10000000] [--streams 5000]

recalibration: S streams of one model are ingested for two weeks (N labelled records a stream a week, one score
column); week 1 is recalibrated and its quiet gates go live (policy auto), then week 2 is recalibrated against
them — S groups × 2 alphas (0.2, 0.3), Clopper–Pearson, fixed_sequence, with the KS and binomial drift tests.
Timed: that second pass, `recalibrate_store` (what `cic recalibrate` runs, MLflow aside). Baseline, same run:
the per-group path (`recalibrate_group` per group: its own pair query and live-gate read), on the first
`--baseline-streams` groups, scaled per group. Target: S = 5000 in under 60 s on a 2-core machine.

ingest: a Parquet file of R records (S streams, timestamps, two scores, labels) is written in chunks, then
ingested by `cic ingest`'s code in a child process (its peak resident memory read from the OS), and the store it
made is recalibrated in another child. Baseline, same run: a child that only reads the whole file into polars
(`pl.read_parquet`), the least any whole-file ingest must hold. Target: peak ≤ 2 GiB for R = 10^7.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cic.pipeline.config import CalibrationConfig  # noqa: E402
from cic.pipeline.production.ingest import ingest_file  # noqa: E402
from cic.pipeline.production.recalibration import (  # noqa: E402
    WindowRule,
    correct_and_alert,
    recalibrate_group,
    recalibrate_store,
)
from cic.pipeline.run.stored_calibration import GroupKey  # noqa: E402
from cic.store import Store  # noqa: E402

CONFIG = CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp",), searches=("fixed_sequence",), n_splits=2)
START = datetime(2026, 10, 1, tzinfo=UTC)
LEVEL = 0.01


def week(streams: int, per_stream: int, start: datetime, seed: int, offset: int = 0) -> pl.DataFrame:
    """One week of traffic: `per_stream` labelled records for each stream, errors growing with the score."""
    rng = np.random.default_rng(seed)
    n = streams * per_stream
    score = rng.random(n)
    stream = np.repeat(np.arange(streams), per_stream)
    index = np.tile(np.arange(per_stream), streams) + offset
    return pl.DataFrame({
        "model": "m", "stream": pl.Series(stream).cast(pl.String).str.pad_start(5, "0").map_elements(
            lambda s: f"s{s}", return_dtype=pl.String),
        "question_id": pl.Series(index).cast(pl.String), "question": "?", "answer": "a",
        "timestamp": pl.Series([start + timedelta(seconds=int(i)) for i in rng.integers(0, 6 * 86400, n)]),
        "score:semantic_entropy": score, "correct": rng.random(n) >= 0.4 * score ** 2})


def recalibration(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db, now = Path(tmp) / "prod.duckdb", START + timedelta(days=30)
        with Store.open(db) as store:
            for k, start in enumerate((START, START + timedelta(days=7))):
                path = Path(tmp) / f"week{k}.parquet"
                week(args.streams, args.per_week, start, seed=k, offset=k * 10_000).write_parquet(path)
                began = time.perf_counter()
                ingest_file(store, path, now=now)
                print(f"ingest week {k + 1}: {args.streams * args.per_week:,} records in "
                      f"{time.perf_counter() - began:.1f} s")
                if k == 0:
                    first = recalibrate_store(store, store.read("runs")["run_key"].to_list(), CONFIG, LEVEL,
                                              WindowRule(), auto_promote=True)
                    print(f"week 1: {len(first.candidates)} candidates, {len(first.promoted)} promoted live")
            run_keys = store.read("runs")["run_key"].to_list()
            runs = store.read("runs").sort("run_key").head(args.baseline_streams)
            began = time.perf_counter()
            results = [recalibrate_group(store, GroupKey(r["run_key"], r["model"], r["dataset"], "semantic_entropy",
                                                         "human"), CONFIG, WindowRule(), {})
                       for r in runs.iter_rows(named=True)]
            correct_and_alert(results, LEVEL)
            per_group_baseline = (time.perf_counter() - began) / max(len(results), 1)
            began = time.perf_counter()
            second = recalibrate_store(store, run_keys, CONFIG, LEVEL, WindowRule())
            elapsed = time.perf_counter() - began
    groups = len({c.key for c in second.candidates})
    print(f"week 2: {groups} groups × {len(CONFIG.alphas)} alphas = {len(second.candidates)} candidates, "
          f"{len(second.checks)} drift tests, {len(second.alerts)} alerts")
    print("| path | groups | seconds | per group |")
    print("|---|---|---|---|")
    print(f"| per group (`recalibrate_group`, baseline) | {len(results)} | {per_group_baseline * len(results):.1f} | "
          f"{per_group_baseline * 1e3:.1f} ms |")
    print(f"| one pass (`recalibrate_store`) | {groups} | {elapsed:.1f} | {elapsed / max(groups, 1) * 1e3:.1f} ms |")
    print(f"one pass is {per_group_baseline * groups / elapsed:.1f}x the per-group path; {args.streams} streams in "
          f"{elapsed:.1f} s (target: under 60 s): {'MET' if elapsed < 60 else 'NOT MET'}")


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
kind, path, db = sys.argv[1:4]
began = time.perf_counter()
if kind == "read":
    import polars as pl
    rows = pl.read_parquet(path).height
elif kind == "ingest":
    from datetime import datetime, UTC
    from cic.pipeline.production.ingest import ingest_file
    from cic.store import Store
    with Store.open(db) as store:
        rows = ingest_file(store, path, now=datetime(2027, 1, 1, tzinfo=UTC)).records
else:
    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
    from cic.store import Store
    config = CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp",), searches=("fixed_sequence",), n_splits=2)
    with Store.open(db) as store:
        rows = len(recalibrate_store(store, store.read("runs")["run_key"].to_list(), config, 0.01,
                                     WindowRule()).candidates)
print(json.dumps({{"rows": rows, "seconds": time.perf_counter() - began,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def child(kind: str, path: Path, db: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), kind, str(path), str(db)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_records(path: Path, records: int, streams: int, chunk: int = 500_000) -> None:
    """R records in chunks (the generator never holds the whole file)."""
    import pyarrow.parquet as pq

    writer = None
    per_stream = -(-records // streams)
    for k, first in enumerate(range(0, records, chunk)):
        n = min(chunk, records - first)
        rng = np.random.default_rng(k)
        index = np.arange(first, first + n)
        score = rng.random(n)
        frame = pl.DataFrame({
            "model": "m", "stream": pl.Series(index // per_stream).cast(pl.String),
            "question_id": pl.Series(index).cast(pl.String), "question": "what is it?", "answer": "an answer",
            "timestamp": pl.Series((index % (28 * 86400)) * 1_000_000 + int(START.timestamp() * 1e6))
            .cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
            "score:semantic_entropy": score, "score:predictive_entropy": score + rng.random(n),
            "correct": rng.random(n) >= 0.4 * score ** 2})
        table = frame.to_arrow()
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()


def ingest(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path, db = Path(tmp) / "month.parquet", Path(tmp) / "prod.duckdb"
        began = time.perf_counter()
        write_records(path, args.records, args.streams)
        print(f"wrote {args.records:,} records ({path.stat().st_size / 2**20:.0f} MiB Parquet) in "
              f"{time.perf_counter() - began:.0f} s")
        read = child("read", path, db)
        stored = child("ingest", path, db)
        recal = child("recalibrate", path, db)
        size = db.stat().st_size / 2**20
    print("| step | records | seconds | peak memory |")
    print("|---|---|---|---|")
    print(f"| read the whole file into polars (baseline) | {read['rows']:,} | {read['seconds']:.0f} | "
          f"{read['peak_mib']:.0f} MiB |")
    print(f"| `cic ingest` (batches of 100,000) | {stored['rows']:,} | {stored['seconds']:.0f} | "
          f"{stored['peak_mib']:.0f} MiB |")
    print(f"| `cic recalibrate` over the store ({args.streams} streams) | {recal['rows']:,} candidates | "
          f"{recal['seconds']:.0f} | {recal['peak_mib']:.0f} MiB |")
    print(f"store: {size:.0f} MiB; ingest peak = {stored['peak_mib'] / read['peak_mib']:.2f}x the whole-file read; "
          f"target ≤ 2048 MiB for ingest and recalibration: "
          f"{'MET' if max(stored['peak_mib'], recal['peak_mib']) <= 2048 else 'NOT MET'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    rec = sub.add_parser("recalibration")
    rec.add_argument("--streams", type=int, default=5000)
    rec.add_argument("--per-week", type=int, default=40)
    rec.add_argument("--baseline-streams", type=int, default=200)
    ing = sub.add_parser("ingest")
    ing.add_argument("--records", type=int, default=10_000_000)
    ing.add_argument("--streams", type=int, default=5000)
    ing.add_argument("--tmp", default=None, help="Directory for the file and the store (large: several GiB).")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    (recalibration if args.part == "recalibration" else ingest)(args)


if __name__ == "__main__":
    main()
