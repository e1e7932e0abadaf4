"""The landing table at scale: workers on a three-node Ray cluster append 10^6 rows to one Delta table, one of them
is killed with SIGKILL mid-append and its batches are redone; the store loads what landed exactly once; and
`cic ingest` reads a 10^6-record Delta table version. Baselines measured in the same run.

    .venv/bin/python benchmarks/bench_landing.py [--rows 1000000] [--writers 4] [--batches 5] [--skip-ingest]

Targets (issue 74): rows = distinct keys = expected after the kill and the redo, and a second load adds nothing;
landing ≥ 200,000 rows/s with 4 writers (beside the plain `deltalake` append of the same batches by the same
writers, the baseline); the load into DuckDB ≥ 100,000 rows/s; `cic ingest` of a 10^6-row Delta version ≤ 30 s
(beside `cic ingest` of the same records as one Parquet file).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cic.store import Store  # noqa: E402
from cic.store.landing import LANDED_TABLES, land, landing_batch, load_landing  # noqa: E402

NOW = datetime.now(UTC)
KEYS = {"generations": ("run_key", "question_id", "sample_index"), "scores": ("run_key", "question_id", "estimator"),
        "labels": ("run_key", "question_id", "criterion")}


def worker_batch(worker: int, index: int, rows: int) -> dict[str, pl.DataFrame]:
    """A worker's batch of about `rows` landing rows: a third each generations, scores, labels."""
    n = max(1, rows // 3)
    ids = [f"q{index * n + i}" for i in range(n)]
    run = f"run-{worker}"
    rng = np.random.default_rng(worker * 1000 + index)
    return {
        "generations": pl.DataFrame({"run_key": run, "question_id": ids, "sample_index": 0, "text": "an answer",
                                     "n_tokens": 3, "logprob_sum": rng.normal(size=n), "logprob_mean": -0.5,
                                     "is_greedy": True, "option_probs": None, "flags": [[]] * n},
                                    schema_overrides={"sample_index": pl.Int32, "n_tokens": pl.Int32,
                                                      "option_probs": pl.List(pl.Float64),
                                                      "flags": pl.List(pl.String)}),
        "scores": pl.DataFrame({"run_key": run, "question_id": ids, "estimator": "predictive_entropy",
                                "value": rng.random(n)}),
        "labels": pl.DataFrame({"run_key": run, "question_id": ids, "criterion": "exact_match",
                                "aligned": rng.random(n) > 0.3, "value": 1.0})}


class Writer:
    """A Ray actor appending its batches to the landing table (or, as the baseline, with plain `deltalake`)."""

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def write(self, table: str, worker: int, index: int, rows: int, plain: bool) -> int:
        batch = worker_batch(worker, index, rows)
        if plain:
            from deltalake import write_deltalake

            write_deltalake(table, landing_batch(batch), mode="append")
            return 0
        return land(table, batch)


def run_writers(ray: Any, actors: list[Any], table: str, batches: int, rows: int, plain: bool,
                kill: int | None = None) -> tuple[float, list[tuple[int, int]]]:
    """Every writer appends its batches; returns seconds and the (worker, batch) pairs to redo (`kill`: the
    process id of worker 0, SIGKILLed while it appends its third batch)."""
    started = time.perf_counter()
    refs = {actors[w].write.remote(table, w, b, rows, plain): (w, b)
            for b in range(batches) for w in range(len(actors))}
    redo: list[tuple[int, int]] = []
    if kill is not None:  # an actor runs its calls in order: the pid was asked before the writes
        while not any(refs[r] == (0, 1) for r in ray.wait(list(refs), num_returns=len(refs), timeout=0)[0]):
            time.sleep(0.005)
        time.sleep(0.05)
        os.kill(kill, signal.SIGKILL)
    for ref, (w, b) in refs.items():
        try:
            ray.get(ref, timeout=600)
        except Exception:  # the killed worker's calls: redone by a fresh worker
            redo.append((w, b))
    return time.perf_counter() - started, redo


def landing_part(rows: int, writers: int, batches: int) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for cpus in (2, 1, 1):  # three worker nodes, four writers
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    per_batch = rows // (writers * batches)
    out: dict[str, Any] = {}
    try:
        actor = ray.remote(num_cpus=1)(Writer)
        with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
            actors = [actor.remote() for _ in range(writers)]
            out["nodes"] = len(set(ray.get([a.node.remote() for a in actors])))
            pid = ray.get(actors[0].pid.remote())
            for a in actors:  # warm: imports done before any clock starts
                ray.get(a.write.remote(f"{tmp}/warm", 99, 0, 30, False))
            out["plain_s"], _ = run_writers(ray, actors, f"{tmp}/plain", batches, per_batch, plain=True)
            out["land_s"], _ = run_writers(ray, actors, f"{tmp}/landing-clean", batches, per_batch, plain=False)
            table = f"{tmp}/landing"
            out["killed_s"], redo = run_writers(ray, actors, table, batches, per_batch, plain=False, kill=pid)
            fresh = actor.remote()
            ray.get([fresh.write.remote(table, w, b, per_batch, False) for w, b in redo])
            out["redone"] = len(redo)
            expected = writers * batches * (per_batch // 3) * 3
            out.update(load_part(Path(tmp), table, expected))
        out["rows"] = writers * batches * (per_batch // 3) * 3
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def load_part(tmp: Path, table: str, expected: int) -> dict[str, Any]:
    """Load into a fresh store twice: rows, distinct keys, the second load's additions, seconds."""
    with Store.open(tmp / "cic.duckdb") as store:
        started = time.perf_counter()
        first = load_landing(store, table)
        load_s = time.perf_counter() - started
        rows = sum(store.count(t) for t in LANDED_TABLES)
        distinct = sum(store.read(t, ordered=False).unique(subset=list(KEYS[t])).height for t in LANDED_TABLES)
        second = load_landing(store, table)
    return {"load_s": load_s, "load_files": first.files, "stored": rows, "distinct": distinct, "expected": expected,
            "second_load_rows": sum(second.rows.values())}


def traffic(records: int) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    score = rng.random(records)
    return pl.DataFrame({
        "model": "m", "stream": [f"s{i}" for i in rng.integers(0, 50, records)],
        "question_id": [f"q{i}" for i in range(records)], "question": "?", "answer": "a",
        "timestamp": pl.datetime_range(NOW - timedelta(days=30), NOW - timedelta(days=1), interval="1s",
                                       time_zone="UTC", eager=True).head(records),
        "score:predictive_entropy": score, "correct": rng.random(records) >= 0.02 + 0.5 * score})


def ingest_part(records: int) -> dict[str, float]:
    """`cic ingest` (the installed command) of one Delta version of R records, beside the same as Parquet."""
    from deltalake import write_deltalake

    cic = str(Path(sys.executable).with_name("cic"))
    out = {}
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        frame = traffic(records)
        frame.write_parquet(f"{tmp}/traffic.parquet")
        write_deltalake(f"{tmp}/traffic", frame.to_arrow(), mode="append")
        for name, source in (("parquet_s", "traffic.parquet"), ("delta_s", "traffic")):
            started = time.perf_counter()
            done = subprocess.run([cic, "ingest", source, "--db", f"{name}.duckdb"], cwd=tmp, capture_output=True,
                                  text=True)
            out[name] = time.perf_counter() - started
            if done.returncode:
                raise SystemExit(f"cic ingest {source} failed: {done.stderr}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args()
    r = landing_part(args.rows, args.writers, args.batches)
    print(f"landing: {r['rows']:,} rows by {args.writers} writers on {r['nodes']} Ray nodes, "
          f"{args.batches} batches each")
    print("| step | seconds | rows/s | target |\n|---|---|---|---|")
    print(f"| plain deltalake append (baseline) | {r['plain_s']:.2f} | {r['rows'] / r['plain_s']:,.0f} | |")
    print(f"| landing (cic.store.landing.land) | {r['land_s']:.2f} | {r['rows'] / r['land_s']:,.0f} | ≥ 200,000 "
          f"({r['plain_s'] / r['land_s']:.2f}× the baseline's rate) |")
    print(f"| load into DuckDB ({r['load_files']} data files) | {r['load_s']:.2f} | {r['stored'] / r['load_s']:,.0f} "
          "| ≥ 100,000 |")
    ok = r["stored"] == r["distinct"] == r["expected"] and r["second_load_rows"] == 0
    print(f"\nkilled run: worker 0 SIGKILLed mid-append, {r['redone']} batch call(s) redone by a fresh worker; "
          f"stored {r['stored']:,} rows, {r['distinct']:,} distinct keys, expected {r['expected']:,}; second load "
          f"added {r['second_load_rows']} — {'exact' if ok else 'NOT EXACT'}")
    if not args.skip_ingest:
        i = ingest_part(args.rows)
        print("\n| cic ingest of 1 version | seconds | target |\n|---|---|---|")
        print(f"| {args.rows:,} records as one Parquet file (baseline) | {i['parquet_s']:.1f} | |")
        print(f"| the same records as one Delta table version | {i['delta_s']:.1f} | ≤ 30 s "
              f"({i['delta_s'] / i['parquet_s']:.2f}× the file) |")


if __name__ == "__main__":
    main()
