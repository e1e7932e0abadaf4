"""The evidence for the default search: power and collapses against the other valid searches, and its FWER.

    .venv/bin/python infra/scripts/search_power_table.py [--quick]

For each score/error model (linear, convex, a step, and a resampled real table: one_minus_max_prob on
CommonsenseQA from infra/examples/real) and alpha from near-unattainable to easy, draws calibration sets of
n = 10^3 .. 10^5 (10^6 for the linear model) answers and calibrates each with the default (`geometric`), the
former default (`fixed_sequence`), `multistart` and Holm over 100 score quantiles (delta = 0.05,
Clopper–Pearson). Prints per cell the mean coverage P(U <= t_hat) of each search, the default's ratio to the best
of the others, and the share of collapses (coverage below half the oracle's, no threshold counting as 0). Then
the default's violation rate P(R(t_hat) > alpha) by Monte Carlo (10,000 draws) at the tightest cells, with its
95% Clopper–Pearson upper bound. docs/statistics.md quotes the output.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.stats.searches import DEFAULT_SEARCH  # noqa: E402
from cic.stats.simulation import binomial_ci  # noqa: E402

DELTA = 0.05
OTHERS = ("fixed_sequence", "multistart", "holm")


@dataclass(frozen=True)
class StepRisk:
    """U ~ Uniform(0, 1); P(error | U = u) = low below `at`, high above."""

    low: float = 0.05
    high: float = 0.5
    at: float = 0.6

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        u = np.sort(rng.random(shape), axis=-1)
        return u, (rng.random(shape) < np.where(u < self.at, self.low, self.high)).astype(np.int8)

    def selection_risk(self, t: np.ndarray) -> np.ndarray:
        t = np.clip(np.asarray(t, dtype=float), 1e-12, 1.0)
        return np.where(t <= self.at, self.low, (self.low * self.at + self.high * (t - self.at)) / t)

    def acceptance(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(t, dtype=float), 0.0, 1.0)

    def oracle_threshold(self, alpha: float) -> float | None:
        if alpha < self.low:
            return None
        if alpha >= self.high:
            return 1.0
        return min(1.0, self.at * (self.high - self.low) / (self.high - alpha))


@dataclass(frozen=True)
class ResampledTable:
    """Answers drawn with replacement from a real (score, error) table: its empirical law is the truth."""

    scores: np.ndarray
    errors: np.ndarray

    def sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        picks = rng.integers(0, self.scores.shape[0], shape)
        order = np.argsort(self.scores[picks], axis=-1, kind="stable")
        picks = np.take_along_axis(picks, order, axis=-1)
        return self.scores[picks], self.errors[picks].astype(np.int8)

    def selection_risk(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        order = np.argsort(self.scores, kind="stable")
        s, e = self.scores[order], np.cumsum(self.errors[order])
        n = np.searchsorted(s, t, side="right")
        return np.where(n > 0, e[np.maximum(n - 1, 0)] / np.maximum(n, 1), 0.0)

    def acceptance(self, t: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.sort(self.scores), np.asarray(t, dtype=float), side="right") / self.scores.shape[0]

    def oracle_threshold(self, alpha: float) -> float | None:
        values = np.unique(self.scores)
        valid = values[self.selection_risk(values) <= alpha]
        return float(valid.max()) if valid.size else None


def real_table() -> ResampledTable:
    import polars as pl

    frame = pl.read_parquet(ROOT / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet").filter(
        dataset="commonsense_qa", estimator="one_minus_max_prob", criterion="option_match")
    return ResampledTable(frame.get_column("score").to_numpy(), frame.get_column("error").to_numpy())


def cells(quick: bool) -> list[tuple[str, object, float, int, int]]:
    """(model name, model, alpha, n, trials)."""
    models = {"linear": (cic.PowerRisk(0.05, 0.35, 1.0), (0.065, 0.10, 0.15)),
              "convex": (cic.PowerRisk(0.02, 0.6, 3.0), (0.021, 0.035, 0.07)),
              "step": (StepRisk(), (0.055, 0.08, 0.15)),
              "real": (real_table(), (0.15, 0.20, 0.25))}
    trials = {1_000: 200, 10_000: 200, 100_000: 40, 1_000_000: 8}
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    out = []
    for name, (model, alphas) in models.items():
        for alpha in alphas:
            for n in sizes + ((1_000_000,) if name == "linear" and not quick else ()):
                out.append((name, model, alpha, n, trials[n] // (4 if quick else 1)))
    return out


def coverage_of(model: object, alpha: float, n: int, trials: int, seed: int) -> dict[str, np.ndarray]:
    """Per search, the coverage of each draw's threshold (0 where none), the draws shared by every search."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {name: [] for name in (DEFAULT_SEARCH, *OTHERS)}
    for _ in range(trials):
        u, e = model.sample(rng, (1, n))  # type: ignore[attr-defined]
        u, e = u[0], e[0]
        for name in out:
            grid = cic.quantile_grid(u, 100) if name == "holm" else None  # scores only: fixed before labels
            t = cic.calibrate(u, e, alpha=alpha, delta=DELTA, bound="cp", search=name, grid=grid,
                              keep_table=False).threshold
            out[name].append(0.0 if t is None else float(model.acceptance(np.array(t))))  # type: ignore[attr-defined]
    return {name: np.array(values) for name, values in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n <= 10^4 and a quarter of the draws")
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"| model | α | n | oracle cov. | {DEFAULT_SEARCH} (default) | fixed_sequence | multistart | holm (100 "
          "quantiles) | default / best other | collapses: default · fixed_sequence |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed, (name, model, alpha, n, trials) in enumerate(cells(args.quick)):
        oracle = model.oracle_threshold(alpha)  # type: ignore[attr-defined]
        oracle_cov = 0.0 if oracle is None else float(model.acceptance(np.array(oracle)))  # type: ignore[attr-defined]
        cov = coverage_of(model, alpha, n, trials, seed)
        best = max(cov[o].mean() for o in OTHERS)
        ratio = "—" if best == 0 else f"{cov[DEFAULT_SEARCH].mean() / best:.3f}"
        collapse = {k: float((cov[k] < 0.5 * oracle_cov).mean()) for k in (DEFAULT_SEARCH, "fixed_sequence")}
        print(f"| {name} | {alpha:g} | {n:,} | {oracle_cov:.3f} | " + " | ".join(
            f"{cov[k].mean():.3f}" for k in (DEFAULT_SEARCH, *OTHERS)) + f" | {ratio} | "
            f"{collapse[DEFAULT_SEARCH]:.0%} · {collapse['fixed_sequence']:.0%} |", flush=True)
    print()
    print("| model | α | n | draws | violations of the default | rate | 95% upper bound |")
    print("|---|---|---|---|---|---|---|")
    draws = 2_500 if args.quick else 10_000
    for name, model, alpha, n in (("linear", cic.PowerRisk(0.05, 0.35, 1.0), 0.065, 1_000),
                                  ("linear", cic.PowerRisk(0.05, 0.35, 1.0), 0.065, 10_000),
                                  ("convex", cic.PowerRisk(0.02, 0.6, 3.0), 0.07, 10_000),
                                  ("step", StepRisk(), 0.055, 10_000)):
        res = cic.simulate(model, n=n, alpha=alpha, delta=DELTA, bound="cp", search=DEFAULT_SEARCH,
                           n_trials=draws, seed=7)
        high = binomial_ci(res.n_violations, res.n_trials)[1]
        print(f"| {name} | {alpha:g} | {n:,} | {draws:,} | {res.n_violations} | {res.violation_rate:.4f} | "
              f"{high:.4f} |", flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
