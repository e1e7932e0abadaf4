"""CIC's default gate beside the rivals a user would reach for, on the committed real table, split by split.

    .venv/bin/pip install --target /tmp/mapie mapie==1.6.0     # benchmark-only; not part of the install
    PYTHONPATH=/tmp/mapie .venv/bin/python benchmarks/bench_anchors.py [--splits 500]

The table: Qwen2.5-Coder-1.5B's answers (infra/examples/real), CommonsenseQA scored by 1 − max option probability
and TriviaQA by weighted semantic entropy. Each split halves the questions (seeded): each method certifies (or
selects) on one half and is judged on the other: coverage (accepted / test questions), the FDR of the accepted test
answers (0 when none), P(FDR > α) over the splits, the share of splits that accept nothing, seconds per
calibration, and what the method guarantees.

- `cic` — `cic.calibrate`, the default search, Clopper–Pearson, δ = 0.05: P(R(t̂) ≤ α) ≥ 1 − δ.
- `lec` — CIC's LEC search: the error rate ≤ α in expectation over calibration sets.
- `mapie-binary` — MAPIE 1.6 `BinaryClassificationController(risk="precision")` over its 100-point grid (Holm, the
  NaN p-values of grid points accepting nothing read as 1): PAC, like `cic`.
- `mapie-multiclass` (CommonsenseQA) — MAPIE 1.6 `MultiClassificationLTTController`: predict the most probable
  option, abstain when its probability is under λ; the risk controlled is the precision of the predictions made
  (`BinaryRisk`: correct among the non-abstained), target 1 − α, Holm over λ ∈ linspace(0, 0.99, 100), and among
  the valid λ the one that abstains least (`best_predict_param_choice=abstention_rate`; MAPIE's default, "auto",
  takes the one with the best precision, which answers least: 0.089 against 0.416 at α = 0.25). The table
  keeps each question's top probability and whether that option was right, so the option matrix handed to MAPIE
  is the top option at p_max and the rest spread evenly (every p_max ≥ 1/5 with five options, so the argmax is
  kept): the accept/abstain decisions and their correctness are exactly the real ones.
- `score-select` — conformal selection (Jin & Candès 2023): conformal p-values of "this test answer is wrong" from
  the calibration half's wrong answers, Benjamini–Hochberg at α: FDR ≤ α in expectation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cic  # noqa: E402
from cic.reports import arena_mapie  # noqa: E402
from cic.reports.arena import score_select  # noqa: E402

DELTA = 0.05
TABLE = ROOT / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet"
CELLS = (("commonsense_qa", "one_minus_max_prob", "option_match", (0.15, 0.2, 0.25)),
         ("trivia_qa", "semantic_entropy_weighted[embedding:0.9]", "similarity[0.5]", (0.1, 0.2, 0.3)))
GUARANTEE = {"cic": "PAC (1 − δ)", "lec": "expectation", "mapie-binary": "PAC (1 − δ)",
             "mapie-multiclass": "PAC (1 − δ)", "score-select": "expectation (FDR)"}


def cic_accepts(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, search: str | None = None) -> np.ndarray:
    kwargs = {"search": search} if search else {}
    t = cic.calibrate(u, e, alpha=alpha, delta=DELTA, bound="cp", keep_table=False, **kwargs).threshold
    return np.zeros(test.shape, dtype=bool) if t is None else test <= t


METHODS: dict[str, Any] = {
    "cic": cic_accepts,
    "lec": lambda u, e, t, a: cic_accepts(u, e, t, a, "lec"),
    "mapie-binary": lambda u, e, t, a: arena_mapie.binary(u, e, t, a, DELTA),
    "mapie-multiclass": lambda u, e, t, a: arena_mapie.multiclass(u, e, t, a, DELTA),
    "score-select": lambda u, e, t, a: score_select(u, e, t, a, DELTA),  # the arena's (cic bench)
}


def run(dataset: str, estimator: str, criterion: str, alphas: tuple[float, ...], splits: int) -> None:
    import polars as pl

    frame = pl.read_parquet(TABLE).filter(dataset=dataset, estimator=estimator, criterion=criterion)
    u, e = frame.get_column("score").to_numpy(), frame.get_column("error").to_numpy().astype(int)
    masks = cic.split_masks(u.shape[0], splits, 0.5, seed=0)
    methods = [m for m in METHODS if m != "mapie-multiclass" or dataset == "commonsense_qa"]
    for alpha in alphas:
        for name in methods:
            coverage, fdr, seconds = np.zeros(splits), np.zeros(splits), np.zeros(splits)
            for i, cal in enumerate(masks):
                start = time.perf_counter()
                accepted = METHODS[name](u[cal], e[cal], u[~cal], alpha)
                seconds[i] = time.perf_counter() - start
                coverage[i] = accepted.mean()
                fdr[i] = e[~cal][accepted].mean() if accepted.any() else 0.0
            print(f"| {dataset} | {alpha:g} | {name} | {GUARANTEE[name]} | {coverage.mean():.3f} | {fdr.mean():.3f} | "
                  f"{(fdr > alpha).mean():.3f} | {(coverage == 0).mean():.3f} | {seconds.mean() * 1e3:.1f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=500)
    args = parser.parse_args()
    from bench_mapie import mapie_version

    print(f"MAPIE {mapie_version()}; {args.splits} splits (calibration half / test half), δ = {DELTA}")
    print("| dataset | α | method | guarantee | coverage | mean FDR | P(FDR > α) | accepts nothing | "
          "ms per calibration |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dataset, estimator, criterion, alphas in CELLS:
        run(dataset, estimator, criterion, alphas, args.splits)


if __name__ == "__main__":
    main()
