"""How close "about N more labelled answers reach alpha" lands (`cic.stats.limits.labels_needed`), on laws whose
answer is known.

    python infra/scripts/labels_needed_table.py [--tables 30] [--draws 100]

Per law × alpha × table size n0: the truth is the smallest calibration size at which CIC's default search
(Clopper–Pearson, delta = 0.05) certifies in at least half of 400 sets drawn from the law itself (bisection to 2%);
the estimate is `labels_needed` on each of `--tables` tables of size n0 drawn from the law. Prints, per cell, the
truth, the median estimate, and the share of tables whose estimate lies within a factor of 2 of the truth (target:
>= 80% overall); where no threshold on the score reaches alpha at all, a correct estimate is "none".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cic.stats.limits import labels_needed  # noqa: E402
from cic.stats.simulation import PowerRisk, simulate  # noqa: E402

#: (name, law, alpha): errors rising with the score at several speeds; the last one's alpha lies below every
#: threshold's risk (no amount of labels reaches it).
CASES = (
    ("linear 0-0.4", PowerRisk(0.0, 0.4, 1.0), 0.05),
    ("linear 0-0.4", PowerRisk(0.0, 0.4, 1.0), 0.1),
    ("steep 0.02-0.6, power 3", PowerRisk(0.02, 0.6, 3.0), 0.05),
    ("flat 0.05-0.3, power 0.5", PowerRisk(0.05, 0.3, 0.5), 0.1),
    ("TriviaQA-like 0.15-0.9", PowerRisk(0.15, 0.9, 1.0), 0.2),
    ("floor 0.12-0.5", PowerRisk(0.12, 0.5, 1.0), 0.1),
)
SIZES = (200, 500, 1000)
TRUTH_TRIALS = 400
MAX_N = 200_000


def truth(law: PowerRisk, alpha: float) -> int | None:
    """The smallest size certifying in half of TRUTH_TRIALS sets from the law; None when alpha < the law's floor."""
    if law.oracle_threshold(alpha) is None:
        return None

    def share(n: int) -> float:
        return 1.0 - simulate(law, n=n, alpha=alpha, n_trials=TRUTH_TRIALS, seed=11).fails / TRUTH_TRIALS

    lo, hi = 1, 64
    while share(hi) < 0.5:
        lo, hi = hi, hi * 2
        if hi > MAX_N:
            return None
    while hi - lo > max(1, hi // 50):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if share(mid) >= 0.5 else (mid, hi)
    return hi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=30, help="tables drawn per cell")
    parser.add_argument("--draws", type=int, default=100, help="draws per size inside labels_needed")
    args = parser.parse_args()
    started = time.perf_counter()
    print("| law | α | truth (labels) | n0 | median estimate | within 2× |")
    print("|---|---|---|---|---|---|")
    hits = total = 0
    rng = np.random.default_rng(0)
    for name, law, alpha in CASES:
        real = truth(law, alpha)
        for n0 in SIZES:
            estimates = []
            for _ in range(args.tables):
                u, e = law.sample(rng, (1, n0))
                estimates.append(labels_needed(u[0], e[0], alpha=alpha, draws=args.draws, seed=1))
            if real is None:
                good = [x is None for x in estimates]
            else:
                good = [x is not None and real / 2 <= x <= 2 * real for x in estimates]
            hits, total = hits + sum(good), total + len(good)
            found = [x for x in estimates if x is not None]
            median = f"{int(np.median(found)):,}" if len(found) > len(estimates) / 2 else "none"
            print(f"| {name} | {alpha:g} | {'none' if real is None else f'{real:,}'} | {n0:,} | {median} | "
                  f"{np.mean(good):.0%} |")
    verdict = "met" if hits / total >= 0.8 else "not met"
    print(f"\nWithin a factor of 2 of the truth: {hits}/{total} = {hits / total:.0%} (target >= 80%: {verdict}); "
          f"{time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
