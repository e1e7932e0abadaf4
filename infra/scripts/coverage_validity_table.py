"""The two-sided certificate in simulation: how often the gate a search certifies answers less than the coverage
bound it states (`cic.stats.coverage`, DKW–Massart), and how often either claim fails (the error claim or the
coverage claim; at most 2δ by a union bound).

    .venv/bin/python infra/scripts/coverage_validity_table.py [--trials 2000]

Laws: `PowerRisk` (continuous scores, known coverage pi(t) = t) and the same law on 10 tied score values (0, 0.1,
…, 0.9: the bound must hold with ties). Prints one row per law, n and alpha: coverage misses, either-claim misses,
each against δ / 2δ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402
from cic.stats.simulation import PowerRisk, binomial_ci  # noqa: E402

DELTA = 0.05
LAWS = {"linear 0→0.5": PowerRisk(0.0, 0.5, 1.0), "steep 0.02→0.6 (u³)": PowerRisk(0.02, 0.6, 3.0)}


def draw(law: PowerRisk, rng: np.random.Generator, n: int, tied: bool) -> tuple[np.ndarray, np.ndarray]:
    """One calibration set: continuous scores, or the same rounded down to a tenth (10 values)."""
    u = rng.random(n)
    if tied:
        u = np.floor(u * 10) / 10
    return u, (rng.random(n) < law.conditional_risk(u)).astype(int)


def truth(law: PowerRisk, threshold: float, tied: bool) -> tuple[float, float]:
    """(pi(t), R(t)) of a gate at t under the law: closed form, or on the tied law by its 10 equally likely values
    k/10 (k = 0..9), each with error probability conditional_risk(k/10)."""
    if not tied:
        return float(law.acceptance(np.array(threshold))), float(law.selection_risk(np.array(threshold)))
    cells = min(int(np.floor(threshold * 10 + 1e-9)) + 1, 10)
    return cells / 10, float(law.conditional_risk(np.arange(cells) / 10).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"| law | scores | n | alpha | coverage misses (<= {DELTA}) | either claim fails (<= {2 * DELTA}) | "
          "mean bound / mean coverage |")
    print("|---|---|---:|---:|---|---|---|")
    for name, law in LAWS.items():
        for tied in (False, True):
            for n, alpha in ((300, 0.2), (1000, 0.15), (3000, 0.1)):
                cover = either = 0
                bounds, covered = [], []
                for _ in range(args.trials):
                    u, e = draw(law, rng, n, tied)
                    result = cic.calibrate(u, e, alpha=alpha, delta=DELTA)
                    if not result.feasible:
                        continue
                    pi, risk = truth(law, float(result.threshold), tied)
                    missed = pi < float(result.coverage_lcb)
                    cover += missed
                    either += missed or risk > alpha
                    bounds.append(result.coverage_lcb)
                    covered.append(pi)
                low, high = binomial_ci(cover, args.trials)
                verdict = "holds" if high <= DELTA or cover / args.trials <= DELTA else "EXCEEDS"
                print(f"| {name} | {'10 tied values' if tied else 'continuous'} | {n} | {alpha:g} | "
                      f"{cover / args.trials:.4f} [{low:.4f}, {high:.4f}] {verdict} | {either / args.trials:.4f} | "
                      f"{np.mean(bounds) if bounds else 0:.3f} / {np.mean(covered) if covered else 0:.3f} |")


if __name__ == "__main__":
    main()
