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

Against the best model alone, two and three models on four laws (`--laws`): "quadratic" the law above (three
models: a middle one wrong with probability 0.025 + 0.4 d^1.5); "confident-wrong" — the small model confidently
wrong on 8% of questions (error 0.5, scores near 0) and the big one blind on 15% (error 0.2, scores uniform on
[0, 0.4]) where the small one is sure and right; "complementary" — two kinds of question, each model good on one
and aware of it; "correlated" — one difficulty each model sees through noise of its own (sd 0.15), the big model
best everywhere. Per cell: the cascade (default paths and shares), the favoured-model rule (`favour="scores"`: the
model whose calibration scores have the lowest median alone at 0.9·delta, the default paths at 0.1·delta), a pilot
alternative (a seeded 30% of the questions, labels read, picks the path on a weight grid
whose certified coverage on the rest is estimated highest; that path certified on the other 70% at delta / 2, the
default paths on all questions at delta / 2, the more answering kept) and each model alone at delta; printed as
coverage, its ratio to the best model alone and the violation rate; the last column is the best model alone
certified at delta / k — what any rule that must find the best of k models by splitting delta equally pays, even
knowing it in advance.

Estimator choice: one model (the big one) scored by K = 5 estimators of increasing noise; each draw chooses by
`choose_estimator` (each at delta / 5) and by the naive rule (each at delta, the most coverage chosen); printed:
violation rates of the chosen gate.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.stats.baselines import lec_routing  # noqa: E402
from cic.stats.cascades import answering_model, calibrate_cascade, cascade_counts, choose_estimator  # noqa: E402
from cic.stats.searches import DEFAULT_SEARCH, Setting, get_search, run_search  # noqa: E402
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


def law(name: str, rng: np.random.Generator, n: int, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(scores, error probabilities) of k models (2 or 3) on n questions under the named law."""
    d = rng.random(n)
    if name == "quadratic":
        probs = [0.03 + 0.7 * d ** 2, 0.025 + 0.4 * d ** 1.5, 0.02 + 0.25 * d]
        noise = (0.08, 0.06, 0.05)
        probs, noise = (probs, noise) if k == 3 else (probs[::2], noise[::2])
        return [p + s * rng.normal(size=n) for p, s in zip(probs, noise, strict=True)], probs
    kind = rng.random(n)
    if name == "confident-wrong":
        wrong_small, blind_big = kind < 0.08, (kind >= 0.08) & (kind < 0.23)
        ps = np.where(wrong_small, 0.5, np.where(blind_big, 0.03, 0.05 + 0.5 * d))
        ss = np.where(wrong_small, 0.1 * rng.random(n), ps) + 0.05 * rng.normal(size=n)
        pb = np.where(blind_big, 0.2, 0.01 + 0.2 * d)
        sb = np.where(blind_big, 0.4 * rng.random(n), pb) + 0.04 * rng.normal(size=n)
        pm = np.where(wrong_small, 0.3, np.where(blind_big, 0.1, 0.03 + 0.35 * d))
        middle = [pm + 0.05 * rng.normal(size=n)], [pm]
    elif name == "correlated":  # one difficulty each model sees through its own noise
        own = [np.clip(d + 0.15 * rng.normal(size=n), 0.0, 1.0) for _ in range(3)]
        ps, pm, pb = 0.05 + 0.6 * own[0] ** 2, 0.03 + 0.4 * own[1] ** 1.5, 0.02 + 0.3 * own[2]
        ss, sb = ps + 0.06 * rng.normal(size=n), pb + 0.05 * rng.normal(size=n)
        middle = [pm + 0.05 * rng.normal(size=n)], [pm]
    else:  # complementary
        first = kind < 0.5
        ps = np.where(first, 0.03 + 0.15 * d, 0.1 + 0.6 * d)
        pb = np.where(first, 0.1 + 0.5 * d, 0.02 + 0.15 * d)
        ss, sb = ps + 0.05 * rng.normal(size=n), pb + 0.05 * rng.normal(size=n)
        pm = 0.06 + 0.3 * d
        middle = [pm + 0.05 * rng.normal(size=n)], [pm]
    if k == 2:
        return [ss, sb], [ps, pb]
    return [ss, middle[0][0], sb], [ps, middle[1][0], pb]


PILOT = 0.3


def pilot_cascade(scores: list[np.ndarray], errors: list[np.ndarray], alpha: float, seed: int,
                  share: float = PILOT) -> tuple[float | None, ...]:
    """The measured alternative: a seeded pilot part picks one path on a weight grid (labels read there), certified
    on the rest at delta / 2; the default paths on every question at delta / 2; the one answering more kept."""
    k, n = len(scores), scores[0].shape[0]
    pilot = np.random.default_rng(seed).random(n) < share
    rest = ~pilot
    weights = (0.0, 0.25, 0.5, 1.0) if k == 3 else (0.0, 0.125, 0.25, 0.5, 1.0)
    grid = [w for w in itertools.product(weights, repeat=k) if max(w) == 1.0]
    plan = get_search(DEFAULT_SEARCH)
    scale = rest.sum() / pilot.sum()

    def estimated(path: tuple[float, ...]) -> float:
        values, accepted, wrong = cascade_counts([u[pilot] for u in scores], [e[pilot] for e in errors], path)
        outcome = run_search(plan, values, np.round(accepted * scale).astype(np.int64),
                             np.round(wrong * scale).astype(np.int64),
                             setting=Setting(int(rest.sum()), "cp", alpha), delta=DELTA / 2, lazy=True)
        return accepted[int(outcome.index[0])] if outcome.index[0] >= 0 else -1

    best = max(grid, key=estimated)
    picked = calibrate_cascade([u[rest] for u in scores], [e[rest] for e in errors], alpha=alpha, delta=DELTA / 2,
                               paths=[best])
    union = calibrate_cascade(scores, errors, alpha=alpha, delta=DELTA / 2)
    found = [r.thresholds for r in (picked, union) if r.certified] or [(None,) * k]
    return max(found, key=lambda t: int((answering_model(scores, t) < k).sum()))


def best_alone_cell(name: str, k: int, alpha: float, n: int, draws: int, seed: int, share: float = PILOT) -> None:
    pop_scores, pop_probs = law(name, np.random.default_rng(7), 200_000, k)
    pop = (pop_scores, pop_probs)
    rng = np.random.default_rng(seed)
    rules = ("cascade (CIC)", "favour: lowest median score", f"pilot {share:.0%} + default",
             *(f"model {i + 1} alone" for i in range(k)))
    shared: list[list[tuple[float, float]]] = [[] for _ in range(k)]  # each model alone at delta / k
    rows: dict[str, list[tuple[float, float]]] = {r: [] for r in rules}
    for i in range(draws):
        scores, probs = law(name, rng, n, k)
        errors = [(rng.random(n) < p).astype(int) for p in probs]
        rows[rules[0]].append(system(pop, calibrate_cascade(scores, errors, alpha=alpha, delta=DELTA).thresholds))
        rows[rules[1]].append(system(pop, calibrate_cascade(scores, errors, alpha=alpha, delta=DELTA,
                                                            favour="scores").thresholds))
        rows[rules[2]].append(system(pop, pilot_cascade(scores, errors, alpha, seed * 100_000 + i, share)))
        for m in range(k):
            t = cic.calibrate(scores[m], errors[m], alpha=alpha, delta=DELTA, keep_table=False).threshold
            rows[rules[3 + m]].append(system(pop, tuple(t if j == m else None for j in range(k))))
            t = cic.calibrate(scores[m], errors[m], alpha=alpha, delta=DELTA / k, keep_table=False).threshold
            shared[m].append(system(pop, tuple(t if j == m else None for j in range(k))))
    cover = {r: float(np.mean([v[0] for v in rows[r]])) for r in rules}
    best = max(cover[r] for r in rules[3:])
    cells = []
    for r in rules:
        bad = sum(risk > alpha for _, risk in rows[r])
        ratio = f" ({cover[r] / best:.2f}×)" if best > 0 and r in rules[:3] else ""
        cells.append(f"{cover[r]:.3f}{ratio} · {bad / draws:.3f}")
    cells += [""] * (3 - k)
    top = max(range(k), key=lambda m: cover[rules[3 + m]])  # the best model, as if known in advance
    price = float(np.mean([v[0] for v in shared[top]]))
    cells.append(f"{price:.3f} ({price / best:.2f}×)" if best > 0 else f"{price:.3f}")
    print(f"| {name} | {k} | {alpha:g} | {n:,} | {draws} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the draws")
    parser.add_argument("--laws", default="quadratic,confident-wrong,complementary,correlated",
                        help="the best-alone table's laws ('' skips it)")
    parser.add_argument("--only-best-alone", action="store_true", help="print only the best-alone table")
    parser.add_argument("--pilot-share", type=float, default=PILOT, help="the pilot alternative's share of questions")
    parser.add_argument("--draws", type=int, default=200, help="draws per cell of the best-alone table")
    args = parser.parse_args()
    start = time.perf_counter()
    rng = np.random.default_rng(2026)
    d = rng.random(200_000)
    probs = list(error_prob(d))
    pop = ([p + s * rng.normal(size=d.shape[0]) for p, s in zip(probs, NOISE, strict=True)], probs)
    scale = 10 if args.quick else 1
    if args.laws:
        print("Against the best model alone. Each cell: mean coverage (ratio to the best model alone at δ) · "
              "violation rate P(risk > α).")
        print("| law | models | α | n | draws | cascade (CIC) | favour: lowest median score | "
              f"pilot {args.pilot_share:.0%} + default | model 1 alone | model 2 alone | model 3 alone | "
              "best model alone at δ/k |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for seed, (name, k, alpha, n) in enumerate(itertools.product(args.laws.split(","), (2, 3), (0.1, 0.15),
                                                                     (500, 1_000, 2_000))):
            best_alone_cell(name, k, alpha, n, max(20, args.draws // scale), 500 + seed, args.pilot_share)
        print()
    if args.only_best_alone:
        print(f"({time.perf_counter() - start:.0f} s)")
        return
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
