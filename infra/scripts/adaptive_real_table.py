"""Adaptive rounds replayed on a real run's stored samples: every question's ten samples in drawn order
(a run with generation.adaptive off stores them all), scored with all ten and with the rule's prefix
(`cic.llm.uncertainty.scorer`, rounds 2-4-6-10: what a run with adaptive rounds on would have stored and scored),
each certified by the paper's protocol (100 random 50/50 splits, Clopper–Pearson, δ = 0.05, fallback search).

    .venv/bin/python infra/scripts/adaptive_real_table.py --db cic-example.duckdb [--criterion C] [--rounds 4,10]
    .venv/bin/python infra/scripts/adaptive_real_table.py \
        --samples infra/examples/real/samples/qwen2.5-coder-1.5b-samples.parquet [--rounds 4,10]

(`--samples`: the committed answers in drawn order, written by `export_example.py --samples`; the greedy answers'
errors come from the long table beside it, `<model>.parquet`.)

Prints per score and α: mean certified coverage with ten samples and adaptive, their ratio against the target
(>= 0.95x), and generations a question (greedy answer included) against the target (<= 4), each met or why not.
The store is opened read-only (a run still writing it waits between its batches).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cic.llm.answering import generations_drawn  # noqa: E402
from cic.llm.embeddings import SentenceEmbedder  # noqa: E402
from cic.llm.uncertainty import UncertaintyScorer, make_equivalence  # noqa: E402
from cic.llm.uncertainty.adaptive import ROUNDS, stop_in  # noqa: E402
from cic.stats.protocol import evaluate_splits  # noqa: E402
from cic.store import Store  # noqa: E402
from cic.store.queries import generations_in_order, greedy_errors  # noqa: E402

ALPHAS = (0.2, 0.25)
ESTIMATORS = ("semantic_entropy", "eigv")
COVERAGE_TARGET, GENERATIONS_TARGET = 0.95, 4.0


def committed(samples: Path, criterion: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A committed samples file and the long table beside it, keyed like a store's rows (run key = dataset)."""
    table = samples.with_name(samples.name.replace("-samples.parquet", ".parquet"))
    rows = pl.read_parquet(samples).rename({"dataset": "run_key"})
    wrong = pl.col("error").cast(pl.Boolean).alias("wrong")
    labels = (pl.read_parquet(table).filter(criterion=criterion)
              .select(pl.col("dataset").alias("run_key"), "question_id", wrong).unique(["run_key", "question_id"]))
    if labels.height == 0:
        sys.exit(f"--criterion {criterion}: not in {table}")
    return rows, labels


def stored(db: str | None, samples: Path | None, criterion: str,
           run_key: str | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The answers of every question of one run with all eleven rows, and its greedy answer's error."""
    if samples is not None:
        rows, labels = committed(samples, criterion)
    else:
        with Store.open(db, read_only=True, wait_s=600) as store:
            rows, labels = generations_in_order(store), greedy_errors(store, criterion)
    keys = sorted(set(rows.get_column("run_key")))
    if run_key is None and len(keys) != 1:
        sys.exit(f"{db or samples}: {len(keys)} runs stored ({', '.join(keys) or 'none'}); name one with --run-key")
    rows = rows.filter(run_key=run_key or keys[0])
    labels = labels.filter(run_key=run_key or keys[0]).drop("run_key")
    whole = rows.group_by("question_id").len().filter(pl.col("len") == ROUNDS[-1] + 1).get_column("question_id")
    return rows.filter(pl.col("question_id").is_in(whole.to_list())), labels


def prefix(rows: pl.DataFrame, scorer: UncertaintyScorer, rounds: tuple[int, ...]) -> pl.DataFrame:
    """The rows a run with adaptive rounds on would have drawn: each question's greedy answer and the rule's prefix."""
    kept = []
    for _, own in rows.sort("question_id", "sample_index").group_by("question_id", maintain_order=True):
        stats = scorer.question_stats(own)
        if stats.is_multiple_choice:  # letters drawn from one forward pass: free, all kept (as the scorer reads)
            kept.append(own)
            continue
        count = stop_in(stats.clusters.tolist(), rounds)
        kept.append(own.filter(pl.col("sample_index") <= count))
    return pl.concat(kept)


def coverage(scores: pl.DataFrame, labels: pl.DataFrame, estimator: str) -> dict[float, float]:
    """Mean certified coverage per α of one stored score name."""
    joined = scores.filter(estimator=estimator).join(labels, on="question_id").drop_nulls("value")
    table = evaluate_splits(joined.get_column("value").to_numpy(), joined.get_column("wrong").cast(int).to_numpy(),
                            alphas=ALPHAS, bounds=["cp"], search="fallback", n_splits=100)
    return dict(zip(table.get_column("alpha").to_list(), table.get_column("coverage_mean").to_list(), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", help="a store whose run kept every sample")
    source.add_argument("--samples", type=Path, help="a committed samples file (export_example.py --samples)")
    parser.add_argument("--criterion", default="similarity[0.5]", help="option_match for CommonsenseQA")
    parser.add_argument("--run-key", help="the run, where the store holds more than one (with --samples: a dataset)")
    parser.add_argument("--rounds", default=",".join(map(str, ROUNDS)), help="cumulative sample counts, last 10")
    args = parser.parse_args()
    rounds = tuple(int(r) for r in args.rounds.split(","))
    rows, labels = stored(args.db, args.samples, args.criterion, args.run_key)
    n = rows.get_column("question_id").n_unique()
    equivalence = make_equivalence("embedding", embedder=SentenceEmbedder(), threshold=0.9)
    full = UncertaintyScorer(equivalence, ESTIMATORS)
    adaptive = UncertaintyScorer(equivalence, ESTIMATORS, adaptive=rounds)
    drawn = prefix(rows, full, rounds)
    full_scores, adaptive_scores = full.score(rows, run_key="r"), adaptive.score(drawn, run_key="r")
    per_question = generations_drawn(drawn) / n
    print(f"{args.db or args.samples}: {n} questions with ten samples stored, criterion {args.criterion}; rounds "
          f"{'-'.join(map(str, rounds))}: {per_question:.2f} generations a question against 11 "
          f"(target <= {GENERATIONS_TARGET:g}: {'met' if per_question <= GENERATIONS_TARGET else 'not met'}), "
          f"tokens {rows['n_tokens'].sum() / max(drawn['n_tokens'].sum(), 1):.2f}x fewer\n")
    print("| score | α | coverage, 10 samples | coverage, adaptive | ratio (target >= 0.95) |")
    print("|---|---|---|---|---|")
    for name, adaptive_name in zip(full.stored_names(), adaptive.stored_names(), strict=True):
        ten, few = coverage(full_scores, labels, name), coverage(adaptive_scores, labels, adaptive_name)
        for alpha in ALPHAS:
            if not ten[alpha]:
                shown = "— (ten samples certify nothing here: too few questions, or α out of reach)"
            else:
                ratio = few[alpha] / ten[alpha]
                shown = f"{ratio:.2f} ({'met' if ratio >= COVERAGE_TARGET else 'not met'})"
            print(f"| {name} | {alpha:g} | {ten[alpha]:.3f} | {few[alpha]:.3f} | {shown} |")


if __name__ == "__main__":
    main()
