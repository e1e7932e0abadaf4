"""Speed of a full paper-style report, with a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_report.py [--quick]

Input: 7 models x 2 datasets, synthetic score tables of 2,000 items each (14 groups, one estimator).
1. `cic.reports.report.write_report`: 5 alphas x 2 bounds x 100 splits per group, plus the split-ratio study
   (5 fractions), the baselines table, PRR and every figure — wall time (target <= 10 s on the 2-core box).
2. The paper tables alone (`evaluate_groups`, 14,000 calibrations over the splits) against the same tables
   computed the plain way: a loop over groups, splits, alphas and bounds calling `cic.calibrate` on each
   calibration part and measuring its test part (same splits, same numbers — checked).
Wall time is the target; CPU time (all threads of this process) is printed beside it because the machine
is shared and wall time moves with other jobs' load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cic  # noqa: E402
from cic.reports.report import ReportConfig, evaluate_groups, write_report  # noqa: E402

MODELS = ("qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "openchat-3.5", "vicuna-7b", "vicuna-13b", "llama-3.1-8b")
DATASETS = ("commonsenseqa", "triviaqa")


def synthetic_frame(n_items: int = 2000, seed: int = 0) -> pl.DataFrame:
    """Per group: scores ~ Uniform(0, 1), P(error | u) = base + slope * u, base and slope varying by model."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, model in enumerate(MODELS):
        for dataset in DATASETS:
            scores = rng.random(n_items)
            p = 0.02 + 0.02 * (i % 3) + (0.25 + 0.05 * i) * scores
            errors = (rng.random(n_items) < p).astype(np.int8)
            parts.append(pl.DataFrame({"model": model, "dataset": dataset, "estimator": "semantic_entropy",
                                       "criterion": "match", "score": scores, "error": errors}))
    return pl.concat(parts)


def loop_tables(frame: pl.DataFrame, config: ReportConfig) -> dict[tuple[str, str, float, str], float]:
    """Baseline: the paper tables by calling calibrate() per split, alpha and bound; returns mean coverage."""
    coverage: dict[tuple[str, str, float, str], float] = {}
    for (model, dataset), part in frame.group_by(["model", "dataset"], maintain_order=True):
        scores, errors = part["score"].to_numpy(), part["error"].to_numpy()
        masks = cic.split_masks(scores.shape[0], config.n_splits, config.cal_fraction, config.seed)
        for bound in config.bounds:
            for alpha in config.alphas:
                accepted = []
                for cal in masks:
                    res = cic.calibrate(scores[cal], errors[cal], alpha=alpha, bound=bound, keep_table=False)
                    test = scores[~cal]
                    accepted.append(0.0 if res.threshold is None else float((test <= res.threshold).mean()))
                coverage[(model, dataset, alpha, bound)] = float(np.mean(accepted))
    return coverage


class Clock:
    """Wall and process CPU time of a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:.2f} s wall ({self.cpu:.2f} s CPU)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 splits instead of 100 (a smoke run)")
    args = parser.parse_args()
    config = ReportConfig(n_splits=20 if args.quick else 100, searches=("paper",))  # the paper's tables
    frame = synthetic_frame()
    print(f"input: {len(MODELS)} models x {len(DATASETS)} datasets x 2,000 items = {frame.height:,} rows; "
          f"{len(config.alphas)} alphas x {len(config.bounds)} bounds x {config.n_splits} splits")

    with tempfile.TemporaryDirectory() as tmp:
        write_report(frame.head(4000), Path(tmp) / "warm", config, n_splits=2)  # imports and first-call costs
        with Clock() as report:
            files = write_report(frame, Path(tmp) / "report", config)
    print(f"[1] full report: {report} (target <= 10 s wall): {len(files.tables)} tables, "
          f"{len(files.figures)} figures, incl. split-ratio study, baselines and PRR")

    with Clock() as tables:
        results = evaluate_groups(frame, config)
    with Clock() as loop:
        looped = loop_tables(frame, config)
    same = all(abs(r["coverage_mean"] - looped[(r["model"], r["dataset"], r["alpha"], r["bound"])]) < 1e-12
               for r in results.iter_rows(named=True))
    n_cal = len(looped) * config.n_splits
    print(f"[2] paper tables, {n_cal:,} calibrations: evaluate_groups {tables}; loop of calibrate() {loop}; "
          f"speed-up {loop.wall / tables.wall:.1f}x wall, {loop.cpu / tables.cpu:.1f}x CPU; same coverage: {same}")
    print(f"    full report / loop of calibrate() for the paper tables alone: {report.wall / loop.wall:.2f}x wall, "
          f"{report.cpu / loop.cpu:.2f}x CPU")


if __name__ == "__main__":
    main()
