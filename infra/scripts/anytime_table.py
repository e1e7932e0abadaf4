"""Evidence for anytime-valid recertification against today's nightly rule, on the same simulated streams.

    .venv/bin/python infra/scripts/anytime_table.py [--runs 200] [--nights 365] [--per-night 200] [--groups 3]

Stream: every night `per-night` labelled answers with scores U ~ Uniform(0, 1) and errors with probability
4·alpha·U, so a threshold t has true error rate R(t) = 2·alpha·t among the answers it accepts: R(t) <= alpha
exactly for t <= 0.5 (the oracle threshold 0.5, coverage 0.5). Two rules serve a threshold each night:
- **nightly window** (today's recalibration): `cic.calibrate` (default search, Clopper–Pearson, delta) on that
  night's answers alone, promoted every night;
- **anytime** (`cic.stats.anytime.AnytimeState`): one state fed every answer in arrival order, 20 thresholds
  0.05 … 1.0 fixed in advance, read every night.
Printed per rule: the share of runs that ever served a threshold with R(t) > alpha over the nights (exact 95%
interval), and mean coverage (the share of answers the served threshold accepts) at nights 1, 7, 30, 90 and the last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.stats.anytime import AnytimeState  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

ALPHA, DELTA = 0.1, 0.05
GRID = np.round(np.linspace(0.05, 1.0, 20), 4)
SHOWN = (1, 7, 30, 90)


def one_run(rng: np.random.Generator, nights: int, per_night: int) -> dict[str, tuple[bool, np.ndarray]]:
    """(ever served a threshold above the boundary, coverage per night) for both rules on one stream."""
    state = AnytimeState.start(GRID, alpha=ALPHA, delta=DELTA)
    cover = {"nightly window": np.zeros(nights), "anytime": np.zeros(nights)}
    bad = {"nightly window": False, "anytime": False}
    for night in range(nights):
        u = rng.random(per_night)
        z = (rng.random(per_night) < 4 * ALPHA * u).astype(int)
        state.update(u, z)
        served = {"nightly window": cic.calibrate(u, z, alpha=ALPHA, delta=DELTA, keep_table=False).threshold,
                  "anytime": state.threshold}
        for rule, t in served.items():
            if t is not None:
                cover[rule][night] = min(t, 1.0)
                bad[rule] |= 2 * ALPHA * min(t, 1.0) > ALPHA + 1e-12
    return {rule: (bad[rule], cover[rule]) for rule in cover}


def groups_run(rng: np.random.Generator, nights: int, per_night: int, groups: int) -> tuple[bool, np.ndarray]:
    """`groups` streams certified together, as `group_by: dataset` does: each its own state at delta / groups;
    (some group ever served a threshold above the boundary, mean coverage over the groups per night)."""
    states = [AnytimeState.start(GRID, alpha=ALPHA, delta=DELTA / groups) for _ in range(groups)]
    cover, bad = np.zeros(nights), False
    for night in range(nights):
        for state in states:
            u = rng.random(per_night)
            state.update(u, (rng.random(per_night) < 4 * ALPHA * u).astype(int))
            t = state.threshold
            if t is not None:
                cover[night] += min(t, 1.0) / groups
                bad |= 2 * ALPHA * min(t, 1.0) > ALPHA + 1e-12
    return bad, cover


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--per-night", type=int, default=200)
    parser.add_argument("--groups", type=int, default=0, help="also G streams certified together at δ/G each "
                        "(their own seed), as `group_by: dataset`")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(2026)
    results = [one_run(rng, args.nights, args.per_night) for _ in range(args.runs)]
    nights = [n for n in (*SHOWN, args.nights) if n <= args.nights]
    print(f"α = {ALPHA}, δ = {DELTA}, {args.per_night} labelled answers a night, {args.nights} nights, "
          f"{args.runs} runs; oracle threshold 0.5 (coverage 0.5).\n")
    print("| rule | ever served R(t) > α (95% CI) | " + " | ".join(f"coverage night {n}" for n in nights) + " |")
    print("|---|---|" + "---|" * len(nights))
    for rule in ("nightly window", "anytime"):
        hits = sum(r[rule][0] for r in results)
        low, high = binomial_ci(hits, args.runs)
        cover = np.mean([r[rule][1] for r in results], axis=0)
        print(f"| {rule} | {hits / args.runs:.3f} [{low:.3f}, {high:.3f}] | "
              + " | ".join(f"{cover[n - 1]:.3f}" for n in nights) + " |")
    if args.groups > 1:
        together = [groups_run(np.random.default_rng(7000 + i), args.nights, args.per_night, args.groups)
                    for i in range(args.runs)]
        hits = sum(bad for bad, _ in together)
        low, high = binomial_ci(hits, args.runs)
        cover = np.mean([c for _, c in together], axis=0)
        print(f"| anytime, {args.groups} groups at δ/{args.groups} (any group) | {hits / args.runs:.3f} "
              f"[{low:.3f}, {high:.3f}] | " + " | ".join(f"{cover[n - 1]:.3f}" for n in nights) + " |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
