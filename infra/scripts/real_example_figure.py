"""The README's picture of the real example: coverage and test FDR against α for Qwen2.5-Coder-1.5B on both
datasets (the committed table, the default search, Clopper–Pearson, 100 splits) — the comparison a user
charts in MLflow after `cic log infra/examples/real/qwen2.5-coder-1.5b.parquet`.

    .venv/bin/python infra/scripts/real_example_figure.py [--out docs/figures/real_example_vs_alpha.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TABLE = ROOT / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet"
SHOWN = {"commonsense_qa": ("one_minus_max_prob", "option_match"),
         "trivia_qa": ("semantic_entropy[embedding:0.9]", "similarity[0.6]")}


def main() -> None:
    import polars as pl

    from cic.reports.figures import coverage_vs_alpha_figure, fdr_vs_alpha_figure
    from cic.reports.report import ReportConfig, evaluate_groups
    from cic.stats.searches import DEFAULT_SEARCH
    from cic.store.score_files import read_long_table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "real_example_vs_alpha.png")
    args = parser.parse_args()
    frame = read_long_table(TABLE)
    chosen = pl.concat([frame.filter((pl.col("dataset") == d) & (pl.col("estimator") == e) & (pl.col("criterion") == c))
                        for d, (e, c) in SHOWN.items()])
    results = evaluate_groups(chosen, ReportConfig(bounds=("cp",), searches=(DEFAULT_SEARCH,)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    coverage = coverage_vs_alpha_figure(results, args.out)
    fdr = fdr_vs_alpha_figure(results, args.out.with_name(args.out.stem.replace("vs_alpha", "fdr_vs_alpha") + ".png"))
    for row in results.sort("dataset", "alpha").iter_rows(named=True):
        fdr_text = "—" if row["fdr_mean"] is None else f"{row['fdr_mean']:.3f}"
        print(f"{row['dataset']:<15} {row['estimator']:<32} alpha {row['alpha']:.2f}: coverage "
              f"{row['coverage_mean']:.3f}, test FDR {fdr_text}, fails {row['fails']}/{row['n_splits']}")
    print(f"written: {coverage.relative_to(ROOT)}, {fdr.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
