"""The evidence for cascades and for choosing the estimator: system risk and coverage against the alternatives.

    .venv/bin/python infra/scripts/cascade_table.py [--quick]

Cascade: question difficulty d ~ Uniform(0, 1); a small model wrong with probability 0.03 + 0.7 d², a big one
with 0.02 + 0.25 d; each model's score is its own error probability plus Gaussian noise (sd 0.08 and 0.05). For
alpha in (0.1, 0.15, 0.2) and n calibration questions, each draw is calibrated by: the cascade
(`cic.stats.cascades.calibrate_cascade`, default paths and search, delta = 0.05); each model alone (the default
search at delta); the naive cascade (each model calibrated alone at alpha, delta, then chained — what a team
does without a system guarantee); and LEC's routing rule (the pair of thresholds on a 40 x 40 grid of score
quantiles with the most coverage such that sum over calibration (Z - alpha S) <= -1: a guarantee in expectation
only). Coverage and the system's true risk are computed on 200,000 fresh questions (expected errors given d).
Printed per cell: mean coverage, the violation rate P(risk > alpha) with its 95% upper bound, mean risk, and
the share each model answers in the cascade.

Estimator choice: one model (the big one) scored by K = 5 estimators of increasing noise; each draw chooses by
`choose_estimator` (each at delta / 5) and by the naive rule (each at delta, the most coverage chosen); printed:
violation rates of the chosen gate.
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
from cic.stats.baselines import lec_routing  # noqa: E402
from cic.stats.cascades import answering_model, calibrate_cascade, choose_estimator  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

DELTA = 0.05
NOISE = (0.08, 0.05)


def error_prob(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return 0.03 + 0.7 * d ** 2, 0.02 + 0.25 * d


def draw(rng: np.random.Generator, n: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(scores, errors, error probabilities) of both models on n questions."""
    d = rng.random(n)
    probs = list(error_prob(d))
    scores = [p + s * rng.normal(size=n) for p, s in zip(probs, NOISE, strict=True)]
    errors = [(rng.random(n) < p).astype(int) for p in probs]
    return scores, errors, probs


def system(pop: tuple[list[np.ndarray], list[np.ndarray]], thresholds: tuple[float | None, ...]) -> tuple[float,
                                                                                                         float]:
    """(coverage, true risk) of thresholds on the population (risk 0 when nothing is answered)."""
    scores, probs = pop
    answering = answering_model(scores, thresholds)
    answered = answering < len(scores)
    if not answered.any():
        return 0.0, 0.0
    p = np.choose(np.minimum(answering, len(scores) - 1), probs)
    return float(answered.mean()), float(p[answered].mean())


def cascade_cell(alpha: float, n: int, draws: int, pop: tuple[list[np.ndarray], list[np.ndarray]],
                 seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in ("cascade", "small", "big", "naive", "lec")}
    shares = []
    for _ in range(draws):
        scores, errors, _ = draw(rng, n)
        result = calibrate_cascade(scores, errors, alpha=alpha, delta=DELTA, models=("small", "big"))
        rows["cascade"].append(system(pop, result.thresholds))
        shares.append(result.shares)
        alone = [cic.calibrate(u, e, alpha=alpha, delta=DELTA, keep_table=False).threshold
                 for u, e in zip(scores, errors, strict=True)]
        rows["small"].append(system(pop, (alone[0], None)))
        rows["big"].append(system(pop, (None, alone[1])))
        rows["naive"].append(system(pop, tuple(alone)))
        rows["lec"].append(system(pop, lec_routing(scores, errors, alpha)))
    cells = []
    for values in rows.values():
        cov, risk = np.array(values).T
        bad = int((risk > alpha).sum())
        cells.append(f"{cov.mean():.3f} · {bad / draws:.3f} (≤ {binomial_ci(bad, draws)[1]:.3f}) · "
                     f"{risk[cov > 0].mean() if (cov > 0).any() else float('nan'):.3f}")
    share = np.mean(shares, axis=0)
    print(f"| {alpha:g} | {n:,} | {draws:,} | " + " | ".join(cells) + f" | {share[0]:.2f} / {share[1]:.2f} |",
          flush=True)


def choice_cell(alpha: float, n: int, draws: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    noise = (0.02, 0.05, 0.1, 0.2, 0.4)
    pop_d = rng.random(200_000)
    pop_p = error_prob(pop_d)[1]
    pop_scores = [pop_p + s * rng.normal(size=pop_d.shape[0]) for s in noise]
    bad = {"choose_estimator": 0, "naive best of K": 0}
    cover = {k: [] for k in bad}
    for _ in range(draws):
        d = rng.random(n)
        p = error_prob(d)[1]
        e = (rng.random(n) < p).astype(int)
        tables = {f"s{i}": (p + s * rng.normal(size=n), e) for i, s in enumerate(noise)}
        valid = choose_estimator(tables, alpha=alpha, delta=DELTA)
        naive = {k: cic.calibrate(u, e, alpha=alpha, delta=DELTA, keep_table=False) for k, (u, e) in tables.items()}
        picked = max(naive, key=lambda k: naive[k].n_accepted if naive[k].threshold is not None else -1)
        for rule, name, result in (("choose_estimator", valid.estimator, valid.result),
                                   ("naive best of K", picked, naive[picked])):
            if name is None or result is None or result.threshold is None:
                cover[rule].append(0.0)
                continue
            u = pop_scores[int(name[1:])]
            accepted = u <= result.threshold
            cover[rule].append(float(accepted.mean()))
            bad[rule] += int(pop_p[accepted].mean() > alpha)
    print(f"| {alpha:g} | {n:,} | {draws:,} | " + " | ".join(
        f"{np.mean(cover[k]):.3f} · {bad[k] / draws:.3f} (≤ {binomial_ci(bad[k], draws)[1]:.3f})" for k in bad) + " |",
        flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the draws")
    args = parser.parse_args()
    start = time.perf_counter()
    rng = np.random.default_rng(2026)
    d = rng.random(200_000)
    probs = list(error_prob(d))
    pop = ([p + s * rng.normal(size=d.shape[0]) for p, s in zip(probs, NOISE, strict=True)], probs)
    scale = 10 if args.quick else 1
    print("Cascade (small -> big). Each cell: mean coverage · violation rate P(risk > α) (95% upper bound) · mean "
          "risk where something is answered.")
    print("| α | n | draws | cascade (CIC) | small alone | big alone | naive cascade (each alone at α, δ) | "
          "LEC routing (expectation) | cascade shares small / big |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, (alpha, n, draws) in enumerate(((0.1, 1_000, 3_000), (0.1, 2_000, 400), (0.15, 1_000, 400),
                                             (0.15, 2_000, 400), (0.2, 1_000, 400), (0.2, 5_000, 200))):
        cascade_cell(alpha, n, max(20, draws // scale), pop, seed)
    print("\nEstimator choice (the big model, 5 estimators). Each cell: mean coverage · violation rate of the "
          "chosen gate (95% upper bound).")
    print("| α | n | draws | choose_estimator (each at δ/5) | naive best of K (each at δ) |")
    print("|---|---|---|---|---|")
    for seed, (alpha, n, draws) in enumerate(((0.1, 1_000, 3_000), (0.1, 5_000, 1_000), (0.15, 1_000, 1_000))):
        choice_cell(alpha, n, max(20, draws // scale), 100 + seed)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
