"""Late labels that depend on correctness, against the anytime rule: counted as they arrive, or after a label window.

    .venv/bin/python infra/scripts/late_label_table.py [--runs 100] [--nights 365] [--per-night 200]

Stream (as `anytime_table.py`): every night `per-night` records with scores U ~ Uniform(0, 1) and errors with
probability 4·alpha·U, so a threshold t has true error rate R(t) = 2·alpha·t among the answers it accepts: R(t) <= alpha
exactly for t <= 0.5. Each record is seen at a uniform time of its night; a right answer's label arrives within a day of
it, a wrong answer's after 1 to 7 days (complaints, escalations, review queues: lateness that depends on correctness).
A pass runs at the end of every night and feeds one `cic.stats.anytime.AnytimeState` (20 thresholds 0.05 … 1.0 fixed in
advance) by one rule:
- **as labels arrive** (the rule before `recalibration.label_window`): the labels that arrived since the last pass, in
  arrival order;
- **label window W** (`cic.pipeline.gates.anytime_gates`): the records seen in (last cutoff, now − W], in record
  order, with the labels they hold by now; one still unlabelled is reported and never counted.
Printed per rule: the share of runs that ever served a threshold with R(t) > alpha over the nights (exact 95% interval),
the mean coverage at nights 7, 30, 90 and the last, and the records never counted per run. The label window must cover
the delay: a row with W shorter than the wrong answers' delay shows what happens when it does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cic.stats.anytime import AnytimeState  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

ALPHA, DELTA = 0.1, 0.05
GRID = np.round(np.linspace(0.05, 1.0, 20), 4)
SHOWN = (7, 30, 90)
RULES = {"as labels arrive": None, "label window 8 days (covers the delay)": 8.0,
         "label window 2 days (shorter than the delay)": 2.0}


def traffic(rng: np.random.Generator, nights: int, per_night: int) -> tuple[np.ndarray, ...]:
    """(score, error, seen, labelled) of every record of the stream, in record order (times in days)."""
    n = nights * per_night
    u = rng.random(n)
    z = (rng.random(n) < 4 * ALPHA * u).astype(int)
    seen = np.sort(np.repeat(np.arange(nights), per_night) + rng.random(n))
    delay = np.where(z == 1, rng.uniform(1.0, 7.0, n), rng.uniform(0.0, 1.0, n))
    return u, z, seen, seen + delay


def one_run(rng: np.random.Generator, nights: int, per_night: int,
            window: float | None) -> tuple[bool, np.ndarray, int]:
    """(ever served a threshold above the boundary, coverage per night, records never counted) under one rule."""
    u, z, seen, labelled = traffic(rng, nights, per_night)
    state = AnytimeState.start(GRID, alpha=ALPHA, delta=DELTA)
    cover, bad, last = np.zeros(nights), False, -np.inf
    by_arrival = np.argsort(labelled, kind="stable")
    arrived = labelled[by_arrival]
    for night in range(nights):
        now = night + 1.0
        if window is None:  # every label that arrived since the last pass, in arrival order
            take = by_arrival[np.searchsorted(arrived, now - 1.0, "right"):np.searchsorted(arrived, now, "right")]
        else:  # the records whose window closed since the last pass, in record order, labelled by now
            cutoff = now - window
            chosen = np.arange(np.searchsorted(seen, last, "right"), np.searchsorted(seen, cutoff, "right"))
            take, last = chosen[labelled[chosen] <= now], max(last, cutoff)
        state.update(u[take], z[take])
        t = state.threshold
        if t is not None:
            cover[night] = t
            bad |= 2 * ALPHA * t > ALPHA + 1e-12
    never = 0 if window is None else int(np.sum((seen <= last) & (labelled > seen + window)))
    return bad, cover, never


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--per-night", type=int, default=200)
    args = parser.parse_args()
    started = time.perf_counter()
    nights = [n for n in (*SHOWN, args.nights) if n <= args.nights]
    print(f"α = {ALPHA}, δ = {DELTA}, {args.per_night} records a night, {args.nights} nights, {args.runs} runs; right "
          "answers labelled within a day, wrong ones after 1–7 days; oracle threshold 0.5 (coverage 0.5).\n")
    print("| rule | ever served R(t) > α (95% CI) | " + " | ".join(f"coverage night {n}" for n in nights)
          + " | records never counted per run |")
    print("|---|---|" + "---|" * len(nights) + "---|")
    for rule, window in RULES.items():
        runs = [one_run(np.random.default_rng(9000 + i), args.nights, args.per_night, window) for i in range(args.runs)]
        hits = sum(bad for bad, _, _ in runs)
        low, high = binomial_ci(hits, args.runs)
        cover = np.mean([c for _, c, _ in runs], axis=0)
        never = np.mean([n for _, _, n in runs])
        print(f"| {rule} | {hits / args.runs:.3f} [{low:.3f}, {high:.3f}] | "
              + " | ".join(f"{cover[n - 1]:.3f}" for n in nights) + f" | {never:.0f} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
