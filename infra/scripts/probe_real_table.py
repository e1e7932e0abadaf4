"""Hidden-state probes against CIC's own estimators on the real example, at the same number of labels.

    .venv/bin/cic run --config example-probes          # the real example with generation.keep_hidden (~50 min)
    .venv/bin/python infra/scripts/probe_real_table.py --db cic-example-probes.duckdb [--splits 10]

Per draw, the questions are halved: a test half (never labelled, never fitted on) and a labelled half. The
accuracy probe is fitted on a fit split of the labelled half (`cic.llm.probes.fit_split`, 40%) and certified on
the rest of it; every single estimator is certified on the whole labelled half (the same labels); the semantic-
entropy probe is fitted, label-free, to semantic entropy on the labelled half and certified on it. Certified =
`cic.calibrate` (cp, fallback, delta 0.05); coverage and error are read on the test half. "limit" is the score's
limit on the test half (`cic.stats.limits.score_limit`: the most a threshold covers with error <= alpha there);
"best single" is the estimator with the highest mean certified coverage (chosen after the fact: favours it; ties
at zero go to the one with the highest limit); "best limit" is the highest limit of any single estimator, the one
an accuracy probe's limit is held against.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402
from cic.llm.hidden import feature_matrix  # noqa: E402
from cic.llm.probes import fit_probe, fit_split  # noqa: E402
from cic.stats.limits import score_limit  # noqa: E402
from cic.store import Store  # noqa: E402
from cic.store.probe_queries import kept_states, run_errors  # noqa: E402

GROUPS = (("commonsense_qa", "option_match"), ("trivia_qa", "similarity[0.5]"), ("trivia_qa", "similarity[0.6]"),
          ("trivia_qa", "exact_match"))
ALPHAS = (0.15, 0.2, 0.25)
POSITIONS = ("prompt", "answer")
FIT_SHARE = 0.4
SE_PREFIX = "semantic_entropy["


def load(db: str, dataset: str, criterion: str) -> tuple[pl.DataFrame, np.ndarray, list[int]]:
    """(question_id, error, one column per estimator) and the kept-state features, in question order."""
    with Store.open(db, read_only=True) as store:
        run = store.read("runs", dataset=dataset).row(0, named=True)
        layers = json.loads(run["generation_config"])["keep_hidden"]
        scores = store.read("scores", run_key=run["run_key"]).filter(~pl.col("estimator").str.starts_with("probe_"))
        labels = run_errors(store, run["run_key"]).filter(pl.col("criterion") == criterion).drop("criterion")
        hidden = kept_states(store, run["run_key"])
    wide = scores.pivot(on="estimator", index="question_id", values="value")
    table = labels.join(wide, on="question_id").join(hidden, on="question_id").sort("question_id")
    features = feature_matrix(table.get_column("hidden").to_list(), len(layers), POSITIONS)
    return table.drop("hidden"), features, layers


def coverage(scores_cal: np.ndarray, errors_cal: np.ndarray, scores_test: np.ndarray, errors_test: np.ndarray,
             alpha: float) -> tuple[float, float | None]:
    """Certified on the calibration part; (share of the test half answered, its error rate there)."""
    result = cic.calibrate(scores_cal, errors_cal, alpha=alpha)
    if result.threshold is None:
        return 0.0, None
    accepted = scores_test <= result.threshold
    return float(accepted.mean()), float(errors_test[accepted].mean()) if accepted.any() else None


def one_draw(table: pl.DataFrame, x: np.ndarray, layers: list[int], seed: int,
             alphas: tuple[float, ...] = ALPHAS) -> list[dict]:
    rng = np.random.default_rng(seed)
    ids = table.get_column("question_id").cast(pl.String).to_numpy()
    e = table.get_column("error").to_numpy().astype(int)
    order = rng.permutation(len(ids))
    test, labelled = order[: len(ids) // 2], order[len(ids) // 2:]
    fit_ids = set(fit_split(list(ids[labelled]), FIT_SHARE, seed))
    fit = np.array([i for i in labelled if ids[i] in fit_ids])
    cal = np.array([i for i in labelled if ids[i] not in fit_ids])
    accuracy = fit_probe("accuracy", x[fit], e[fit], list(ids[fit]), model="example", layers=layers,
                         positions=POSITIONS, target_name="criterion", seed=seed)
    accuracy.check_disjoint(list(ids[cal]), "calibration")
    estimators = [c for c in table.columns if c not in ("question_id", "error")]
    se_name = next(c for c in estimators if c.startswith(SE_PREFIX))
    se_values = table.get_column(se_name).to_numpy()
    entropy = fit_probe("semantic_entropy", x[labelled], se_values[labelled], list(ids[labelled]), model="example",
                        layers=layers, positions=POSITIONS, target_name=se_name, seed=seed)
    probe_acc, probe_se = accuracy.score(x), entropy.score(x)
    rows = []
    for alpha in alphas:
        row = {"alpha": alpha, "draw": seed}
        row["acc_cov"], row["acc_err"] = coverage(probe_acc[cal], e[cal], probe_acc[test], e[test], alpha)
        row["acc_limit"] = score_limit(probe_acc[test], e[test], alpha)
        row["sep_cov"], _ = coverage(probe_se[labelled], e[labelled], probe_se[test], e[test], alpha)
        for name in estimators:
            s = table.get_column(name).to_numpy()
            keep = ~np.isnan(s)
            if keep.mean() < 0.99:
                continue  # an estimator this dataset does not score
            row[f"cov::{name}"], _ = coverage(s[labelled], e[labelled], s[test], e[test], alpha)
            row[f"limit::{name}"] = score_limit(s[test], e[test], alpha)
        row["se_name"] = se_name
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--datasets", nargs="*", default=None, help="only these datasets (default: both)")
    parser.add_argument("--alphas", nargs="*", type=float, default=list(ALPHAS))
    args = parser.parse_args()
    print(f"{args.splits} draws; test half never labelled; accuracy probe fitted on {FIT_SHARE:.0%} of the "
          "labelled half and certified on the rest; single estimators certified on the whole labelled half; cp, "
          "fallback, delta 0.05; coverage on the test half")
    print()
    print("| dataset · criterion | α | best single (certified) | its limit | best limit | accuracy probe (certified) "
          "| its limit | its test error | SE (10 samples) | SE probe (1 pass) | ratio |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for dataset, criterion in GROUPS:
        if args.datasets and dataset not in args.datasets:
            continue
        table, x, layers = load(args.db, dataset, criterion)
        alphas = tuple(args.alphas)
        frame = pl.DataFrame([r for d in range(args.splits) for r in one_draw(table, x, layers, d, alphas)])
        for alpha in alphas:
            part = frame.filter(pl.col("alpha") == alpha)
            covs = {c.split("::", 1)[1]: part.get_column(c).mean() for c in part.columns if c.startswith("cov::")}
            limits = {k: part.get_column(f"limit::{k}").mean() for k in covs}
            best = max(covs, key=lambda k: (covs[k], limits[k]))
            top = max(limits, key=lambda k: limits[k])
            se_name = part.get_column("se_name")[0]
            acc_err = part.get_column("acc_err").drop_nulls()
            se_cov, sep_cov = covs[se_name], part.get_column("sep_cov").mean()
            print(f"| {dataset} · {criterion} | {alpha} | {best} {covs[best]:.3f} | "
                  f"{limits[best]:.3f} | {top} {limits[top]:.3f} | {part.get_column('acc_cov').mean():.3f} | "
                  f"{part.get_column('acc_limit').mean():.3f} | "
                  f"{acc_err.mean() if acc_err.len() else float('nan'):.3f} | {se_cov:.3f} | {sep_cov:.3f} | "
                  f"{sep_cov / se_cov if se_cov else float('nan'):.2f} |")
    print()
    print("generations a question: each single estimator as stored (greedy + 10 samples for the sampled ones; one "
          "for the one-pass ones); both probes: 1 (the greedy pass that kept the states)")


if __name__ == "__main__":
    main()
