"""Print docs/statistics.md's per-group validity table: per-group certification (delta / G each) against the
pooled gate on a simulated mix where one group is worse than the pool.

    python infra/scripts/group_validity_table.py [--repetitions 2000] [--seed 0]

Three groups (3,000, 3,000 and 1,500 calibration answers), scores uniform, P(error | u) = 0.05 + 0.6 u, plus
0.10 in the third group; alpha = 0.25, delta = 0.1, Clopper–Pearson, fixed_sequence. Each gate is judged by its
true error rate among the answers it accepts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cic.stats.groups import group_validity  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.perf_counter()
    study = group_validity(repetitions=args.repetitions, seed=args.seed)
    reps = args.repetitions
    print("| gates | P(some group's error rate > α) [99% CI] | worse group: mean threshold served |")
    print("|---|---|---|")
    for name, key, coverage in (("one per group, each at δ/G", "per_group_violation",
                                 "worse_group_coverage_per_group"),
                                ("one pooled gate, at δ", "pooled_violation", "worse_group_coverage_pooled")):
        low, high = binomial_ci(round(study[key] * reps), reps, 0.99)
        print(f"| {name} | {study[key]:.3f} [{low:.3f}, {high:.3f}] | {study[coverage]:.3f} |")
    print(f"\nδ = {study['delta']:g}, α = {study['alpha']:g}, {reps} repetitions, seed {args.seed}, "
          f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
