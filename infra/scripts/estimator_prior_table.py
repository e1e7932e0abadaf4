"""The evidence for a prior in the estimator choice: twelve estimators at small n, shares of delta from other data.

    .venv/bin/python infra/scripts/estimator_prior_table.py [--draws 400]

One model, wrong with probability p(d) = 0.02 + 0.3 d on questions of difficulty d ~ Uniform(0, 1), scored by
K = 12 estimators: estimator k scores p(d) plus Gaussian noise of sd SIGMA[k] (from 0.03 to 0.5: a few good ones,
many weak). Each draw has n calibration questions; the rules choose an estimator and its gate:
- "uniform": `choose_estimator` without a prior (each at delta / 12 — `estimator: auto` today);
- "prior": `choose_estimator(prior=…)` (the best-ranked at 0.7·delta, the next at 0.2·delta, the other ten sharing
  0.1·delta), the prior being each estimator's certified coverage on a *past* dataset of 1,000 questions drawn
  independently (other data); three priors: "same law" (the past data follow this law), "neighbours swapped" (on
  the past data the best two estimators swap noise levels, as do the next pairs: a prior whose top choice is
  second-best here) and "reversed" (the past ranking is upside down);
- "top alone at 0.9·delta" (the alternative measured, through `certify_system(shares=…)`, same-law prior);
- "best alone at delta": the estimator best on the population, certified alone at delta — what no rule that must
  choose can beat, the reference of the ratio.
Coverage and risk are the chosen gate's on 200,000 fresh questions (expected errors); printed per cell: mean
coverage (ratio to the best alone) and the violation rate P(risk > alpha).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402
from cic.stats.cascades import certify_system, choose_estimator  # noqa: E402

DELTA = 0.05
SIGMA = (0.03, 0.05, 0.07, 0.1, 0.13, 0.17, 0.21, 0.25, 0.3, 0.35, 0.42, 0.5)
NAMES = tuple(f"e{k:02d}" for k in range(len(SIGMA)))
PRIORS = ("same law", "neighbours swapped", "reversed")


def draw(rng: np.random.Generator, n: int, sigma: tuple[float, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """n questions: each estimator's scores and the 0/1 errors."""
    p = 0.02 + 0.3 * rng.random(n)
    errors = (rng.random(n) < p).astype(int)
    return {name: p + s * rng.normal(size=n) for name, s in zip(NAMES, sigma, strict=True)}, errors


def past_sigma(kind: str) -> tuple[float, ...]:
    """The noise levels on the past dataset the prior is measured on."""
    if kind == "same law":
        return SIGMA
    if kind == "reversed":
        return SIGMA[::-1]
    swapped = list(SIGMA)
    for i in range(0, len(swapped) - 1, 2):
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
    return tuple(swapped)


def prior_of(rng: np.random.Generator, kind: str, alpha: float) -> dict[str, float]:
    """Each estimator's certified coverage on an independent past dataset of 1,000 questions."""
    scores, errors = draw(rng, 1_000, past_sigma(kind))
    return {name: cic.calibrate(u, errors, alpha=alpha, delta=DELTA, keep_table=False).n_accepted / 1_000
            for name, u in scores.items()}


def truth(pop: tuple[dict[str, np.ndarray], np.ndarray], name: str | None, threshold: float | None
          ) -> tuple[float, float]:
    """(coverage, risk) of a gate on the population (0, 0 when it answers nothing)."""
    if name is None or threshold is None:
        return 0.0, 0.0
    accepted = pop[0][name] <= threshold
    return float(accepted.mean()), float(pop[1][accepted].mean()) if accepted.any() else 0.0


def top_alone_shares(prior: dict[str, float]) -> dict[str, float]:
    """The alternative: the best-ranked at 0.9·delta, the other eleven sharing 0.1·delta."""
    top = max(NAMES, key=lambda n: prior[n])
    return {n: (0.9 if n == top else 0.1 / (len(NAMES) - 1)) * DELTA for n in NAMES}


def cell(alpha: float, n: int, draws: int, seed: int, pop: tuple[dict[str, np.ndarray], np.ndarray]) -> None:
    rng = np.random.default_rng(seed)
    best = NAMES[0]  # the least noisy estimator: best on the population
    rules = ["uniform", *(f"prior · {k}" for k in PRIORS), "top alone · same law", "best alone"]
    rows: dict[str, list[tuple[float, float]]] = {r: [] for r in rules}
    for _ in range(draws):
        scores, errors = draw(rng, n, SIGMA)
        tables = {name: (u, errors) for name, u in scores.items()}
        chosen = choose_estimator(tables, alpha=alpha, delta=DELTA)
        rows["uniform"].append(truth(pop, chosen.estimator, chosen.result.threshold if chosen.result else None))
        priors = {k: prior_of(rng, k, alpha) for k in PRIORS}
        for kind in PRIORS:
            chosen = choose_estimator(tables, alpha=alpha, delta=DELTA, prior=priors[kind])
            rows[f"prior · {kind}"].append(truth(pop, chosen.estimator,
                                               chosen.result.threshold if chosen.result else None))
        top = certify_system({k: ([u], [e]) for k, (u, e) in tables.items()}, alpha=alpha, delta=DELTA,
                             shares=top_alone_shares(priors["same law"]))
        rows["top alone · same law"].append(truth(pop, top.estimator, top.thresholds[0]))
        alone = cic.calibrate(scores[best], errors, alpha=alpha, delta=DELTA, keep_table=False)
        rows["best alone"].append(truth(pop, best, alone.threshold))
    reference = float(np.mean([c for c, _ in rows["best alone"]]))
    cells = []
    for rule in rules:
        cover = float(np.mean([c for c, _ in rows[rule]]))
        bad = sum(r > alpha for _, r in rows[rule]) / draws
        ratio = f" ({cover / reference:.2f}×)" if reference > 0 and rule != "best alone" else ""
        cells.append(f"{cover:.3f}{ratio} · {bad:.3f}")
    print(f"| {alpha:g} | {n:,} | {draws} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args()
    start = time.perf_counter()
    rng = np.random.default_rng(2026)
    p = 0.02 + 0.3 * rng.random(200_000)  # the population's risk is the expected error, not a drawn one
    pop = ({name: p + s * rng.normal(size=p.shape[0]) for name, s in zip(NAMES, SIGMA, strict=True)}, p)
    print(f"K = {len(NAMES)} estimators, delta = {DELTA}; each cell: mean coverage (ratio to the best estimator "
          "alone at delta) · violation rate P(risk > alpha)")
    print("| α | n | draws | uniform (δ/12 each) | prior (0.7δ, 0.2δ, rest) · same law | · neighbours swapped | "
          "· reversed | top alone at 0.9δ · same law | best alone at δ |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, (alpha, n) in enumerate(((0.1, 300), (0.1, 500), (0.1, 1_000), (0.15, 300), (0.15, 500),
                                       (0.15, 1_000))):
        cell(alpha, n, args.draws, 900 + seed, pop)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
