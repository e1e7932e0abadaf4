"""Print docs/statistics.md's monitoring table: a live gate checked every night for a year, by the anytime-valid
monitor and by the fixed-level binomial test on the growing window, on the same simulated years.

    python infra/scripts/monitoring_table.py [--repetitions 10000] [--seed 0]

365 nights, 100 answered questions a night, alpha = 0.1, level = 0.01; the true error rate among answered
questions is alpha + shift (shift 0 is the worst case the null allows). Per rule and shift: the share of years
with an alarm (99% Clopper–Pearson interval) and the median / 90th-percentile night of the first alarm.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cic.stats.monitoring import schedule_study  # noqa: E402

NAMES = {"anytime": "anytime-valid monitor (e-value ≥ 1/level)", "fixed_level": "binomial test each night at level"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.perf_counter()
    rows = schedule_study(repetitions=args.repetitions, seed=args.seed)
    print("| true rate | rule | years with an alarm [99% CI] | first alarm: median night | 90th percentile |")
    print("|---|---|---|---|---|")
    for r in rows:
        rate = f"α + {r['shift']:.2f}" if r["shift"] else "α (no excess)"
        print(f"| {rate} | {NAMES[str(r['rule'])]} | {r['alarm_rate']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}] "
              f"| {r['median_night']:g} | {r['p90_night']:g} |")
    print(f"\n{args.repetitions} simulated years per row, seed {args.seed}, {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
