"""Print the README's headline table of the real example from its committed long table.

    python infra/scripts/example_table.py [infra/examples/real/qwen2.5-coder-1.5b.parquet]

For each dataset with its paper criterion (option match; similarity >= 0.6), with semantic entropy (the paper's
score) and with the estimator of highest prediction rejection ratio on this table, the split protocol (100
random 50/50 splits, delta = 0.05, the default search): test FDR, coverage and fails per alpha for
Clopper–Pearson (and Hoeffding for semantic entropy); then deployable gates calibrated on the whole table; then,
for the estimator of highest PRR per dataset, the default search beside `geometric` (the former default) and LEC
(a guarantee in expectation only) on the same splits, with the share of splits whose test FDR exceeded alpha —
the column that tells a 1 - delta guarantee from an expectation.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

import cic
import cic.stats.searches
from cic.stats.curves import prediction_rejection_ratio
from cic.stats.searches import DEFAULT_SEARCH

TABLE = Path("infra/examples/real/qwen2.5-coder-1.5b.parquet")
MAIN = {"commonsense_qa": "option_match", "trivia_qa": "similarity[0.6]"}
ESTIMATOR = "semantic_entropy[embedding:0.9]"
ALPHAS = (0.05, 0.10, 0.15, 0.20, 0.25)


def datasets(frame: pl.DataFrame) -> Iterator[tuple[str, pl.DataFrame, dict[str, Any], str]]:
    """Per dataset with its paper criterion: its rows, each estimator's PRR and the estimator with the highest."""
    for dataset, criterion in MAIN.items():
        rows = frame.filter(dataset=dataset, criterion=criterion)
        if rows.height == 0:
            continue
        prr = {name: prediction_rejection_ratio(g.get_column("score").to_numpy(), g.get_column("error").to_numpy())
               for (name,), g in rows.group_by("estimator")}
        yield dataset, rows, prr, max((n for n in prr if prr[n] is not None), key=lambda n: prr[n])


def main() -> None:
    frame = pl.read_parquet(sys.argv[1] if len(sys.argv) > 1 else TABLE)
    print("| dataset (questions, base error) | score | bound | " + " | ".join(f"α = {a:g}" for a in ALPHAS) + " |")
    print("|---|---|---|" + "---|" * len(ALPHAS))
    gates = []
    for dataset, rows, prr, best in datasets(frame):
        first = True
        for estimator, bounds in ((ESTIMATOR, ("cp", "hoeffding")), (best, ("cp",))):
            if estimator == ESTIMATOR and not first:
                continue
            group = rows.filter(estimator=estimator)
            scores, errors = group.get_column("score").to_numpy(), group.get_column("error").to_numpy()
            table = cic.evaluate_splits(scores, errors, alphas=ALPHAS, bounds=bounds, search=DEFAULT_SEARCH,
                                        n_splits=100, seed=0)
            for bound in bounds:
                cells = []
                for row in table.filter(bound=bound).sort("alpha").iter_rows(named=True):
                    fdr = "—" if row["fdr_mean"] is None else f"{row['fdr_mean']:.3f}"
                    cells.append(f"FDR {fdr} · cov {row['coverage_mean']:.2f} · fails {row['fails']}")
                label = f"{dataset} ({group.height:,}, {errors.mean():.3f})" if first else ""
                name = f"{estimator.split('[')[0]} (PRR {prr[estimator]:.2f})"
                print(f"| {label} | {name} | {'Clopper–Pearson' if bound == 'cp' else 'Hoeffding'} | "
                      + " | ".join(cells) + " |")
                first = False
            for alpha in (0.1, 0.2):
                result = cic.calibrate(scores, errors, alpha=alpha, bound="cp")
                gates.append(f"- {dataset}, {estimator.split('[')[0]}, α = {alpha:g}: {result.summary()}; answers "
                             f"{result.n_accepted / len(scores):.0%} of the {len(scores):,} questions")
    print()
    print("\n".join(gates))
    print()
    side_by_side(frame)


def side_by_side(frame: pl.DataFrame) -> None:
    """Per dataset's highest-PRR estimator, Clopper–Pearson: coverage · mean test FDR · share of splits with
    test FDR > alpha, for the default, `geometric` and `lec`, 100 splits."""
    searches = (DEFAULT_SEARCH, "geometric", "lec")
    print("| dataset | score | search (guarantee) | " + " | ".join(f"α = {a:g}" for a in ALPHAS) + " |")
    print("|---|---|---|" + "---|" * len(ALPHAS))
    for dataset, rows, _, best in datasets(frame):
        group = rows.filter(estimator=best)
        scores, errors = group.get_column("score").to_numpy(), group.get_column("error").to_numpy()
        for search in searches:
            table = cic.evaluate_splits(scores, errors, alphas=ALPHAS, bounds="cp", search=search, n_splits=100,
                                        seed=0)
            cells = []
            for row in table.sort("alpha").iter_rows(named=True):
                if row["fdr_mean"] is None:
                    cells.append(f"cov {row['coverage_mean']:.2f} · nothing certified")
                    continue
                cells.append(f"cov {row['coverage_mean']:.2f} · FDR {row['fdr_mean']:.3f} · "
                             f"> α in {row['fdr_above_alpha']:.0%}")
            kind = cic.stats.searches.get_search(search).short_guarantee
            print(f"| {dataset} | {best.split('[')[0]} | {search} ({kind}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
