"""Speed of the statistics core, each figure a ratio against a baseline timed in the same run.

    .venv/bin/python benchmarks/bench_calibration.py [--quick]

1. calibrate(bound="cp", search="paper") on 10^6 scores vs np.sort of the same array (target <= 3x).
2. The literal Algorithm 1 loop on 4,000 scores vs calibrate on the same data (speed-up).
3. evaluate_splits, 100 splits x 5 alphas x 2 bounds on 10^4 items (target <= 1 s), vs a loop of
   calibrate() calls over the same splits (speed-up).
4. evaluate_splits with the defaults (100 splits x 5 alphas x 2 bounds, paper search) on 10^6 items
   (target <= 20 s on the 2-core machine), vs the same number (100) of np.argsort calls on the 10^6 scores.
Times are the best of several repeats (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cic  # noqa: E402
from tests.support.reference import algorithm1  # noqa: E402


def best_time(func: Callable[[], Any], repeats: int) -> float:
    """Shortest wall time of `repeats` calls (after one warm-up call)."""
    func()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform scores; P(error | u) = 0.6 u, so the base error rate is 0.3 and R(t) = 0.3 t."""
    rng = np.random.default_rng(seed)
    scores = rng.random(n)
    return scores, (rng.random(n) < 0.6 * scores).astype(np.int8)


def loop_over_splits(scores: np.ndarray, errors: np.ndarray, masks: np.ndarray, alphas: tuple[float, ...],
                     bounds: tuple[str, ...]) -> int:
    """Baseline for the protocol: one calibrate() per split, alpha and bound, then the test measures."""
    found = 0
    for cal in masks:
        test_s, test_e = scores[~cal], errors[~cal]
        for bound in bounds:
            for alpha in alphas:
                res = cic.calibrate(scores[cal], errors[cal], alpha=alpha, bound=bound, search="paper",
                                    keep_table=False)
                if res.threshold is not None:
                    accepted = test_s <= res.threshold
                    found += int(test_e[accepted].sum() >= 0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (for a smoke run)")
    args = parser.parse_args()
    repeats = 3 if args.quick else 9

    scores, errors = synthetic(1_000_000, seed=0)
    t_sort = best_time(lambda: np.sort(scores), repeats)
    t_cal = best_time(lambda: cic.calibrate(scores, errors, alpha=0.1, bound="cp", search="paper"), repeats)
    res = cic.calibrate(scores, errors, alpha=0.1, bound="cp", search="paper")
    print(f"[1] calibrate(cp, paper), 10^6 scores: {t_cal * 1e3:.1f} ms; np.sort: {t_sort * 1e3:.1f} ms; "
          f"ratio {t_cal / t_sort:.2f}x (target <= 3x); threshold {res.threshold:.4f}, n = {res.n_accepted}")

    small_s, small_e = synthetic(4000, seed=1)
    start = time.perf_counter()
    literal = algorithm1(small_s, small_e, 0.1, 0.05, "cp")
    t_literal = time.perf_counter() - start
    t_fast = best_time(lambda: cic.calibrate(small_s, small_e, alpha=0.1, bound="cp", search="paper"), repeats)
    same = literal == cic.calibrate(small_s, small_e, alpha=0.1, bound="cp", search="paper").threshold
    print(f"[2] literal Algorithm 1 loop, 4,000 scores: {t_literal:.2f} s; calibrate: {t_fast * 1e3:.2f} ms; "
          f"speed-up {t_literal / t_fast:,.0f}x; same threshold: {same}")

    mid_s, mid_e = synthetic(10_000, seed=2)
    alphas, bounds = (0.05, 0.10, 0.15, 0.20, 0.25), ("hoeffding", "cp")
    t_eval = best_time(lambda: cic.evaluate_splits(mid_s, mid_e, alphas=alphas, bounds=bounds, n_splits=100,
                                                   search="paper"), max(1, repeats // 3))
    masks = cic.split_masks(10_000, 100, 0.5, seed=0)
    start = time.perf_counter()
    loop_over_splits(mid_s, mid_e, masks, alphas, bounds)
    t_loop = time.perf_counter() - start
    print(f"[3] evaluate_splits, 100 splits x 5 alphas x 2 bounds, 10^4 items: {t_eval:.3f} s (target <= 1 s); "
          f"loop of 1,000 calibrate() calls: {t_loop:.2f} s; speed-up {t_loop / t_eval:.1f}x")

    start = time.perf_counter()
    for _ in range(100):
        np.argsort(scores)
    t_argsort = time.perf_counter() - start
    start = time.perf_counter()
    table = cic.evaluate_splits(scores, errors, alphas=alphas, bounds=bounds, n_splits=100, search="paper")
    t_big = time.perf_counter() - start
    print(f"[4] evaluate_splits defaults, 10^6 items: {t_big:.1f} s (target <= 20 s); 100 np.argsort calls on "
          f"10^6 scores: {t_argsort:.1f} s; ratio {t_big / t_argsort:.2f}x; fails {table['fails'].sum()}")


if __name__ == "__main__":
    main()
