"""Labels that never come, by law of missingness: worst-case imputation (the default) against leaving them out.

    .venv/bin/python infra/scripts/missing_label_table.py [--runs 300] [--n 2000] [--nights 60] [--anytime-runs 100]

Data (as `anytime_table.py`): scores U ~ Uniform(0, 1), errors with probability 4·alpha·U, so a threshold t has true
error rate R(t) = 2·alpha·t among the answers it accepts (R(t) <= alpha exactly for t <= 0.5, the oracle's coverage
0.5). A record's label goes missing (its label window closed without it) with a probability that depends, by law, on
nothing, on the score, on the correctness or on both. Each record then enters the product's own cut
(`cic.pipeline.run.missing_labels.counted`): under `worst_case` an unlabelled record is an error wherever a threshold
accepts it; under `at_random` it is left out.
- **One calibration** (the window rule's, a first gate's): `n` records, `cic.calibrate` with the default search at
  delta; printed: the share of runs whose certified threshold has R(t) > alpha (exact 95% interval) and the mean
  coverage (the certified threshold is the accepted share here).
- **Anytime** (`recalibration.rule: anytime`): 200 records a night for `nights` nights into one
  `cic.stats.anytime.AnytimeState` (20 thresholds 0.05 … 1.0), each record counted once its window closed; printed:
  the share of runs that ever served a threshold with R(t) > alpha, and the mean coverage on the last night.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cic.pipeline.run.missing_labels import AT_RANDOM, WORST_CASE, counted  # noqa: E402
from cic.stats.anytime import AnytimeState  # noqa: E402
from cic.stats.calibration import calibrate  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

ALPHA, DELTA = 0.1, 0.05
GRID = np.round(np.linspace(0.05, 1.0, 20), 4)
Law = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: P(label missing | score u, error z)
LAWS: dict[str, Law] = {
    "every label comes": lambda u, z: np.zeros_like(u),
    "5% missing at random": lambda u, z: np.full_like(u, 0.05),
    "20% missing at random": lambda u, z: np.full_like(u, 0.20),
    "by score: 90% of labels above 0.3 never come": lambda u, z: np.where(u > 0.3, 0.9, 0.0),
    "by correctness: half of wrong answers' labels never come": lambda u, z: np.where(z == 1, 0.5, 0.0),
    "by both: 80% of wrong answers above 0.3, else 5%": lambda u, z: np.where((u > 0.3) & (z == 1), 0.8, 0.05),
}


def records(rng: np.random.Generator, n: int, law: Law) -> pl.DataFrame:
    """n records in record order: score, the error a certificate sees (1 where the label is missing), labelled."""
    u = rng.random(n)
    z = (rng.random(n) < 4 * ALPHA * u).astype(np.int8)
    labelled = rng.random(n) >= law(u, z)
    return pl.DataFrame({"score": u, "error": np.where(labelled, z, 1).astype(np.int8), "labelled": labelled,
                         "at": np.arange(n)})


def one_calibration(rng: np.random.Generator, n: int, law: Law, policy: str) -> tuple[bool, float]:
    """(certified threshold invalid, coverage) of one calibration on n records."""
    pairs = counted(records(rng, n, law), None, policy)
    result = calibrate(pairs.get_column("score").to_numpy(), pairs.get_column("error").to_numpy(), alpha=ALPHA,
                       delta=DELTA, keep_table=False)
    t = result.threshold
    return (t is not None and 2 * ALPHA * min(t, 1.0) > ALPHA + 1e-12), (min(t, 1.0) if t is not None else 0.0)


def one_stream(rng: np.random.Generator, nights: int, law: Law, policy: str) -> tuple[bool, float]:
    """(ever served an invalid threshold, coverage on the last night) of one anytime state fed night by night."""
    state, bad = AnytimeState.start(GRID, alpha=ALPHA, delta=DELTA), False
    for _ in range(nights):
        night = counted(records(rng, 200, law), None, policy)
        state.update(night.get_column("score").to_numpy(), night.get_column("error").to_numpy())
        if state.threshold is not None:
            bad |= 2 * ALPHA * state.threshold > ALPHA + 1e-12
    return bad, float(state.threshold or 0.0)


def row(name: str, policy: str, runs: list[tuple[bool, float]]) -> str:
    hits = sum(bad for bad, _ in runs)
    low, high = binomial_ci(hits, len(runs))
    return (f"| {name} | {policy} | {hits / len(runs):.3f} [{low:.3f}, {high:.3f}] | "
            f"{np.mean([c for _, c in runs]):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--nights", type=int, default=60)
    parser.add_argument("--anytime-runs", type=int, default=100)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"α = {ALPHA}, δ = {DELTA}; R(t) = 2αt, oracle threshold 0.5 (coverage 0.5).\n")
    print(f"One calibration on {args.n} records ({args.runs} runs, default search):\n")
    print("| labels missing | missing_labels | certified R(t) > α (95% CI) | mean coverage |")
    print("|---|---|---|---|")
    for i, (name, law) in enumerate(LAWS.items()):
        for policy in (WORST_CASE, AT_RANDOM):
            print(row(name, policy, [one_calibration(np.random.default_rng([i, k]), args.n, law, policy)
                                     for k in range(args.runs)]))
    print(f"\nAnytime rule, 200 records a night for {args.nights} nights ({args.anytime_runs} runs):\n")
    print("| labels missing | missing_labels | ever served R(t) > α (95% CI) | coverage, last night |")
    print("|---|---|---|---|")
    for i, (name, law) in enumerate(LAWS.items()):
        if "at random" in name and "20%" not in name:
            continue
        for policy in (WORST_CASE, AT_RANDOM):
            print(row(name, policy, [one_stream(np.random.default_rng([100 + i, k]), args.nights, law, policy)
                                     for k in range(args.anytime_runs)]))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
