"""`cic evaluate` on 10^7 labelled pairs: wall time, peak memory and when its first progress line appears.

    .venv/bin/python benchmarks/bench_evaluate.py [--pairs 10000000] [--splits 5] [--baseline-pairs 1000000]

A Parquet file of N (score, error) pairs is evaluated by the installed `cic evaluate FILE --n-splits S` (every
default: five alphas, both bounds, the default search), as a user runs it, in a subprocess whose peak resident
memory is read from the kernel (wait4). Targets (issue 54): <= 60 s and <= 2 GB for 10^7 pairs x 5 splits on the
two-core reference machine, a progress line within seconds of the start. In the same run, on `--baseline-pairs`
pairs, the split protocol in-process twice: as it runs now (feasibility tables in blocks, read up to each scan's
first failure) and as it ran before (one table over every count per level), so the gain is a ratio measured here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CIC = str(Path(sys.executable).with_name("cic"))


def pairs(n: int, path: Path) -> Path:
    """N pairs whose error rate rises with the score (5% to 45%)."""
    rng = np.random.default_rng(0)
    score = rng.random(n)
    pl.DataFrame({"score": score, "error": (rng.random(n) < 0.05 + 0.4 * score).astype(np.int8)}).write_parquet(path)
    return path


def run_cli(path: Path, splits: int) -> tuple[float, float | None, float, int]:
    """(wall s, first stderr line s or None, peak RSS GiB, exit code) of `cic evaluate`."""
    env = {**os.environ, "CIC_PROGRESS_AFTER_S": "0", "COLUMNS": "200"}
    started = time.perf_counter()
    proc = subprocess.Popen([CIC, "evaluate", str(path), "--n-splits", str(splits)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    first: list[float] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.strip() and not first:
                first.append(time.perf_counter() - started)
                print(f"  first stderr line at {first[0]:.1f} s: {line.strip()[:100]}", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5)
    return wall, (first[0] if first else None), usage.ru_maxrss / 2**20, proc.returncode


def in_process(n: int, splits: int, *, before: bool) -> float:
    """Seconds of the split protocol on n pairs; `before`: one table over every count per level, read whole."""
    import cic.stats.searches as searches
    import cic.stats.sequential as sequential
    from cic.stats.protocol import evaluate_splits

    rng = np.random.default_rng(1)
    score = rng.random(n)
    error = (rng.random(n) < 0.05 + 0.4 * score).astype(np.int8)
    saved = sequential.SCAN_CHUNK, searches.FeasibilityTables.BLOCK
    if before:
        sequential.SCAN_CHUNK, searches.FeasibilityTables.BLOCK = 1 << 62, 1 << 62
    try:
        started = time.perf_counter()
        evaluate_splits(score, error, alphas=[0.05, 0.1, 0.15, 0.2, 0.25], bounds=["hoeffding", "cp"],
                        n_splits=splits)
        return time.perf_counter() - started
    finally:
        sequential.SCAN_CHUNK, searches.FeasibilityTables.BLOCK = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000_000)
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--baseline-pairs", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cic-bench-evaluate-") as tmp:
        path = pairs(args.pairs, Path(tmp) / "pairs.parquet")
        print(f"cic evaluate on {args.pairs:,} pairs x {args.splits} splits (CLI, every default):", flush=True)
        wall, first, rss, code = run_cli(path, args.splits)
    print(f"  exit {code}, {wall:.1f} s, peak {rss:.2f} GiB (targets: <= 60 s, <= 2 GiB, a line within seconds)")
    now = in_process(args.baseline_pairs, args.splits, before=False)
    then = in_process(args.baseline_pairs, args.splits, before=True)
    print(f"split protocol on {args.baseline_pairs:,} pairs in-process: {now:.1f} s now, {then:.1f} s with one "
          f"table per level over every count (before): {then / now:.1f}x")
    ok = code == 0 and wall <= 60 and rss <= 2 and first is not None and first <= 10
    print("targets met" if ok else "targets NOT met")


if __name__ == "__main__":
    main()
