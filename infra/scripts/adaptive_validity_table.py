"""Validity of the adaptive sample count (`cic.llm.uncertainty.adaptive`) on a law where stopping early is tempting
and wrong.

    python infra/scripts/adaptive_validity_table.py [--trials 1000] [--n 1000]

Each question has a confidence c ~ U(0, 1): its 10 samples fall in its dominant meaning set with probability
c, else in one of 5 others; its most likely answer is the dominant meaning, wrong with probability 0.02 + 0.5 (1 − c)
— and for a tenth of the questions ("confidently wrong") c ~ U(0.8, 1) and the dominant meaning is wrong with
probability 0.3. Stopping after two agreeing samples gives many of those a score of 0, beside right answers. The
adaptive score (semantic entropy of the samples the `settled` rule draws in rounds 2, 4, 6, 10) and the full one
(all 10) are each calibrated on n questions (Clopper–Pearson, δ = 0.05, the fallback search) in every trial; the
certified threshold's true risk is measured on 400,000 fresh questions. Printed per α: P(true risk > α) with its
95% interval, mean coverage, and mean samples drawn (+ 1 greedy answer = generations per question).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cic.llm.uncertainty.adaptive import ROUNDS, adaptive_semantic_entropy  # noqa: E402
from cic.stats.calibration import calibrate  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

K, OTHERS, DELTA, ALPHAS = 10, 5, 0.05, (0.15, 0.2, 0.25)


def questions(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(adaptive score, full score, samples drawn, error) of n simulated questions."""
    confident_wrong = rng.random(n) < 0.1
    c = np.where(confident_wrong, rng.uniform(0.8, 1.0, n), rng.random(n))
    wrong = rng.random(n) < np.where(confident_wrong, 0.3, 0.02 + 0.5 * (1 - c))
    dominant = rng.random((n, K)) < c[:, None]
    clusters = np.where(dominant, 0, 1 + rng.integers(0, OTHERS, (n, K)))
    adaptive = np.empty(n)
    drawn = np.empty(n, dtype=int)
    full = np.empty(n)
    for i in range(n):
        adaptive[i], drawn[i] = adaptive_semantic_entropy(clusters[i].tolist(), ROUNDS)
        counts = np.bincount(clusters[i])
        p = counts[counts > 0] / K
        full[i] = -(p * np.log(p)).sum() + 0.0
    return adaptive, full, drawn, wrong.astype(float)


def true_risk(score: np.ndarray, error: np.ndarray, threshold: float | None) -> tuple[float, float]:
    """(risk among accepted, coverage) of a threshold on the population; (0, 0) when it accepts nothing."""
    if threshold is None:
        return 0.0, 0.0
    accepted = score <= threshold
    return (float(error[accepted].mean()) if accepted.any() else 0.0), float(accepted.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    pop_adaptive, pop_full, pop_drawn, pop_error = questions(rng, 400_000)
    print(f"Population: base error rate {pop_error.mean():.3f}; the adaptive rule draws {pop_drawn.mean():.2f} "
          f"samples a question on average ({pop_drawn.mean() + 1:.2f} generations with the greedy answer, against "
          f"{K + 1}); {args.trials} calibration sets of n = {args.n}, δ = {DELTA}, Clopper–Pearson, fallback.\n")
    print("| score | α | P(true risk > α) [95% CI] | mean coverage | generations / question |")
    print("|---|---|---|---|---|")
    results: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for _ in range(args.trials):
        cal_adaptive, cal_full, _, cal_error = questions(rng, args.n)
        for name, cal, pop in (("adaptive 2-10", cal_adaptive, pop_adaptive), ("all 10 samples", cal_full, pop_full)):
            for alpha in ALPHAS:
                t = calibrate(cal, cal_error, alpha=alpha, delta=DELTA, bound="cp", keep_table=False).threshold
                results.setdefault((name, alpha), []).append(true_risk(pop, pop_error, t))
    for (name, alpha), runs in results.items():
        over = sum(risk > alpha for risk, _ in runs)
        low, high = binomial_ci(over, len(runs))
        cost = pop_drawn.mean() + 1 if name.startswith("adaptive") else K + 1
        print(f"| {name} | {alpha:g} | {over / len(runs):.3f} [{low:.3f}, {high:.3f}] | "
              f"{np.mean([c for _, c in runs]):.3f} | {cost:.2f} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
