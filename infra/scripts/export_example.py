"""Export a finished run of the real example as the long (score, error) table + provenance, for `cic report`.

    python infra/scripts/export_example.py --db cic-example.duckdb --out infra/examples/real \
        --model-file ~/.cache/cic/models/qwen2.5-coder-1.5b-instruct.gguf --commit <sha of the run's checkout>

Writes OUT/<model>.parquet with columns model, dataset, estimator, criterion, question_id, score, error,
generations (one row per question and group, every stored group of every run of the config; generations: what
the score cost on that question — 1 for a one-pass score, else every stored free-text answer of it, the most
likely one included, and 1 for a multiple-choice question, whose letters come from one forward pass) and
OUT/PROVENANCE.md (or the file `--provenance` names: model file sha256, config, run keys, commit, dates,
machine, wall time from the store's own timestamps). Prints the per-dataset counts and base error rates it wrote.
With `--samples`, also OUT/<model>-samples.parquet: every stored answer in drawn order (dataset, question_id,
sample_index 0 = the most likely answer, text, tokens, log-probabilities), so a stopping rule can be replayed from
the committed files (`infra/scripts/adaptive_real_table.py --samples`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from cic.llm.uncertainty.estimators import get_estimator
from cic.pipeline.config import SHIPPED_CONFIGS, load_config
from cic.pipeline.run.stored_calibration import groups_of_run
from cic.store import Store
from cic.store.queries import generations_by_question, generations_in_order, last_label_time

SAMPLE_COLUMNS = ("dataset", "question_id", "sample_index", "text", "n_tokens", "logprob_sum", "logprob_mean",
                  "option_probs")


def samples_table(store: Store, runs: pl.DataFrame) -> pl.DataFrame:
    """Every stored answer of these runs in drawn order, named by dataset instead of run key."""
    datasets = runs.select("run_key", "dataset")
    return (generations_in_order(store).join(datasets, on="run_key").select(SAMPLE_COLUMNS)
            .sort("dataset", "question_id", "sample_index"))


def sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def one_pass(estimator: str) -> bool:
    """Whether a stored estimator name reads the most likely answer alone (cost 1)."""
    return get_estimator(estimator.split("[", 1)[0]).one_pass


def long_table(store: Store, run_keys: list[str]) -> pl.DataFrame:
    parts = []
    for run in store.read("runs", run_key=run_keys).iter_rows(named=True):
        cost = generations_by_question(store, run["run_key"])
        for group in groups_of_run(store, run):
            pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                            run_key=group.run_key, allow_partial=True)
            pairs = pairs.join(cost, on="question_id", how="left").with_columns(
                generations=pl.lit(1, dtype=pl.Int64) if one_pass(group.estimator)
                else pl.col("generations").cast(pl.Int64))
            parts.append(pairs.select(pl.lit(group.model).alias("model"), pl.lit(group.dataset).alias("dataset"),
                                      pl.lit(group.estimator).alias("estimator"),
                                      pl.lit(group.criterion).alias("criterion"), "question_id", "score", "error",
                                      "generations"))
    return pl.concat(parts).sort("dataset", "estimator", "criterion", "question_id")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--config", default="example", help="the config that produced the run (name or path)")
    parser.add_argument("--out", type=Path, default=Path("infra/examples/real"))
    parser.add_argument("--model-file", type=Path, required=True)
    parser.add_argument("--commit", required=True, help="commit of the checkout that ran the pipeline")
    parser.add_argument("--machine", default=f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU")
    parser.add_argument("--provenance", default="PROVENANCE.md", help="file name of the provenance under --out")
    parser.add_argument("--model-source", default="assembled by `infra/scripts/fetch_example_model.py`",
                        help="where the model file came from, in words")
    parser.add_argument("--samples", action="store_true", help="also write every stored answer in drawn order")
    parser.add_argument("--resumed", action="store_true",
                        help="the run was stopped and resumed: its wall time is not a measure of speed")
    args = parser.parse_args()

    config = load_config(args.config)
    with Store.open(args.db, read_only=True) as store:
        runs = store.read("runs").filter(pl.col("model").is_in([m.name for m in config.models]),
                                         pl.col("dataset").is_in([d.name for d in config.datasets]))
        keys = runs.get_column("run_key").to_list()
        table = long_table(store, keys)
        started = runs.get_column("created_at").min()
        finished = last_label_time(store, keys)
        questions = {r["dataset"]: store.count("questions", dataset=r["dataset"]) for r in runs.iter_rows(named=True)}
        samples = samples_table(store, runs) if args.samples else None
    args.out.mkdir(parents=True, exist_ok=True)
    model = config.models[0].name
    table.write_parquet(args.out / f"{model}.parquet", compression="zstd")
    if samples is not None:
        samples.write_parquet(args.out / f"{model}-samples.parquet", compression="zstd")
    summary = table.filter(pl.col("estimator").str.starts_with("semantic_entropy[")).group_by(
        "dataset", "criterion").agg(pl.len().alias("questions"), pl.col("error").mean().alias("base_error_rate")
                                    ).sort("dataset", "criterion")
    wall = finished - started if started is not None and finished is not None else None
    lines = [
        f"# Provenance of `{model}.parquet`", "",
        f"- produced by `cic run --config {args.config}`"
        + (" (shipped in `cic/pipeline/configs/`)" if args.config in SHIPPED_CONFIGS else "")
        + f", commit `{args.commit}`",
        f"- model file `{args.model_file.name}`, {args.model_file.stat().st_size:,} bytes, sha256 "
        f"`{sha256(args.model_file.expanduser())}` ({args.model_source})",
        f"- run keys: {', '.join(f'`{k}`' for k in keys)}",
        f"- questions stored: {', '.join(f'{d} {n:,}' for d, n in questions.items())}; "
        f"rows in the table: {table.height:,} ({table.select('estimator').n_unique()} estimators)",
        f"- run registered {started:%Y-%m-%d %H:%M} UTC, last label stored {finished:%Y-%m-%d %H:%M} UTC"
        + (" (stopped and resumed across sessions: not a measure of speed)" if args.resumed else
           f" ({wall.total_seconds() / 3600:.2f} h wall, one 2-core machine)" if wall is not None else ""),
        *([f"- `{model}-samples.parquet`: {samples.height:,} stored answers in drawn order (sample_index 0: the most "
           "likely answer), for replaying a stopping rule"] if samples is not None else []),
        f"- machine: {args.machine}",
        f"- exported {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `infra/scripts/export_example.py`", "",
        "| dataset | criterion | questions | base error rate |", "|---|---|---|---|",
        *[f"| {r['dataset']} | {r['criterion']} | {r['questions']:,} | {r['base_error_rate']:.3f} |"
          for r in summary.iter_rows(named=True)], ""]
    (args.out / args.provenance).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
