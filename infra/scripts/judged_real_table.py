"""Judge plus people on the committed real table: TriviaQA (Qwen2.5-Coder-1.5B, 1,000 questions), the similarity
criterion as the judge on every question and exact match as the people's label on a random subset.

    .venv/bin/python infra/scripts/judged_real_table.py [--draws 40] [--people 200]

Per estimator and alpha: mean coverage (share of the 1,000 questions answered) of the judge-plus-people gate
(`cic.calibrate_judged`), of the people's labels alone on the same subset, and of exact match on every question,
over `draws` random subsets; how often the judge-plus-people gate's exact-match error on all 1,000 questions exceeds
alpha (the table read as the law); and how often judge and exact match agree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet"
JUDGE, PEOPLE = "similarity[0.5]", "exact_match"
ESTIMATORS = ("eigv[embedding:0.9]", "lexical_similarity", "semantic_entropy[embedding:0.9]")
ALPHAS = (0.5, 0.6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--people", type=int, default=200)
    args = parser.parse_args()
    long = pl.read_parquet(TABLE).filter(pl.col("dataset") == "trivia_qa")
    print(f"TriviaQA, judge {JUDGE}, people {PEOPLE} on {args.people} random questions, {args.draws} draws, "
          "delta 0.05; coverage = share of all questions answered")
    print()
    print("| estimator | alpha | agreement | judge+people | people alone | people on all | ratio | "
          "draws with error > alpha |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for estimator in ESTIMATORS:
        wide = (long.filter(pl.col("estimator") == estimator)
                .pivot(on="criterion", index=["question_id", "score"], values="error").sort("question_id"))
        s = wide.get_column("score").to_numpy()
        judge, truth = wide.get_column(JUDGE).to_numpy(), wide.get_column(PEOPLE).to_numpy()
        ids = wide.get_column("question_id").cast(pl.String).to_list()  # the betting order, as the CLI passes it
        for alpha in ALPHAS:
            rng = np.random.default_rng(0)
            full = cic.calibrate(s, truth, alpha=alpha)
            judged, alone, bad = [], [], 0
            for _ in range(args.draws):
                chosen = rng.permutation(s.shape[0])[:args.people]
                human = np.full(s.shape[0], np.nan)
                human[chosen] = truth[chosen]
                r = cic.calibrate_judged(s, judge, human, alpha=alpha, ids=ids)
                judged.append(0.0 if r.threshold is None else float(np.mean(s <= r.threshold)))
                bad += r.threshold is not None and float(truth[s <= r.threshold].mean()) > alpha
                a = cic.calibrate(s[chosen], truth[chosen], alpha=alpha)
                alone.append(0.0 if a.threshold is None else float(np.mean(s <= a.threshold)))
            mj, ma = float(np.mean(judged)), float(np.mean(alone))
            ratio = f"{mj / ma:.2f}" if ma > 0 else "—"
            print(f"| {estimator} | {alpha} | {np.mean(judge == truth):.3f} | {mj:.3f} | {ma:.3f} | "
                  f"{full.n_accepted / s.shape[0]:.3f} | {ratio} | {bad}/{args.draws} |", flush=True)


if __name__ == "__main__":
    main()
