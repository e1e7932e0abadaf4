"""The real two-model table: SmolLM2-135M -> Qwen2.5-Coder-1.5B on the full CommonsenseQA validation set.

    python infra/scripts/real_cascade_table.py [--estimator one_minus_max_prob] [--splits 100]
    python infra/scripts/real_cascade_table.py --dataset trivia_qa --cheap answer_nll_mean \
        --one-pass infra/examples/real/qwen2.5-coder-1.5b-one-pass.parquet
    python infra/scripts/real_cascade_table.py --dataset trivia_qa --cheap answer_nll_mean --one-pass T --table T

Input: the committed long tables of both models (`infra/examples/real/*.parquet`, provenance beside them), joined
on question id, criterion option match. On the split protocol (random 50/50 splits, seed 0, delta = 0.05,
Clopper–Pearson, the default search) each split calibrates: each model alone; the cascade (small model first,
`cic.stats.cascades.calibrate_cascade`); the naive cascade (each model's own gate at alpha, delta, chained); LEC's
routing rule (`cic.stats.baselines.lec_routing`, a guarantee in expectation); and the big model with its
estimator chosen from all ten (`choose_estimator`, each at delta / 10). Each is measured on the test half:
coverage, test FDR (mean over splits that answer something), the share of those splits with FDR above alpha,
fails (splits that answer nothing), and for the cascade the share each model answers. Prints a Markdown table.

Second table, the score cascade everybody runs (one model, Qwen): its cheap score from the one greedy pass
(`--cheap`, default 1 - max option probability) decides first, and its expensive score (`--expensive`, default
semantic entropy over the 10 samples) is computed only for the questions the cheap one does not accept; both stages
answer with the same greedy answer, so they share its error. Cost is generations per question: 1 for the greedy
pass, + `--samples` (10) where the expensive score is needed. Each rule calibrated on the same splits; columns:
coverage, cost, mean test FDR, P(test FDR > alpha) over splits answering something, fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.stats.baselines import lec_routing  # noqa: E402
from cic.stats.cascades import answering_model, calibrate_cascade, choose_estimator  # noqa: E402
from cic.stats.curves import prediction_rejection_ratio  # noqa: E402

TABLES = {"smollm2-135m": ROOT / "infra/examples/real/smollm2-135m.parquet",
          "qwen2.5-coder-1.5b": ROOT / "infra/examples/real/qwen2.5-coder-1.5b.parquet"}
ALPHAS = (0.05, 0.1, 0.15, 0.2, 0.25)
DELTA = 0.05
SCORE_RULES = ("cheap score alone", "expensive score alone", "score cascade (CIC)")
RULES = ("SmolLM2 alone", "Qwen alone", "cascade (CIC)", "naive cascade", "LEC routing (expectation)",
         "Qwen, estimator auto (δ/10)")


def joined() -> tuple[pl.DataFrame, list[str]]:
    """One row per (estimator, question): both models' score and error; and the model names in cost order."""
    parts = []
    for model, path in TABLES.items():
        part = pl.read_parquet(path).filter(dataset="commonsense_qa", criterion="option_match")
        parts.append(part.select("estimator", "question_id", pl.col("score").alias(f"score_{model}"),
                                 pl.col("error").alias(f"error_{model}")))
    return parts[0].join(parts[1], on=["estimator", "question_id"]).sort("estimator", "question_id"), list(TABLES)


def system(us: list[np.ndarray], es: list[np.ndarray], thresholds: tuple[float | None, ...],
           test: np.ndarray) -> tuple[float, float | None, np.ndarray]:
    """On the test questions: (coverage, FDR or None when nothing is answered, share each model answers)."""
    answering = answering_model([u[test] for u in us], thresholds)
    answered = answering < len(us)
    shares = np.array([np.mean(answering == i) for i in range(len(us))])
    if not answered.any():
        return 0.0, None, shares
    wrong = np.choose(np.minimum(answering, len(us) - 1), [e[test] for e in es])
    return float(answered.mean()), float(wrong[answered].mean()), shares


def run_split(us: list[np.ndarray], es: list[np.ndarray], auto: dict[str, tuple[np.ndarray, np.ndarray]],
              alpha: float, cal: np.ndarray) -> dict[str, tuple[float, float | None, np.ndarray]]:
    """Every rule calibrated on `cal`, measured on the rest."""
    test = ~cal
    alone = tuple(cic.calibrate(u[cal], e[cal], alpha=alpha, delta=DELTA, bound="cp", keep_table=False).threshold
                  for u, e in zip(us, es, strict=True))
    cascade = calibrate_cascade([u[cal] for u in us], [e[cal] for e in es], alpha=alpha, delta=DELTA, bound="cp")
    choice = choose_estimator({k: (u[cal], e[cal]) for k, (u, e) in auto.items()}, alpha=alpha, delta=DELTA,
                              bound="cp")
    out = {RULES[0]: system(us, es, (alone[0], None), test), RULES[1]: system(us, es, (None, alone[1]), test),
           RULES[2]: system(us, es, cascade.thresholds, test), RULES[3]: system(us, es, alone, test),
           RULES[4]: system(us, es, lec_routing([u[cal] for u in us], [e[cal] for e in es], alpha), test)}
    if choice.estimator is None:
        out[RULES[5]] = (0.0, None, np.zeros(2))
    else:
        u, e = auto[choice.estimator]
        out[RULES[5]] = system([u], [e], (choice.result.threshold,), test)
    return out


def cell(values: list[tuple[float, float | None, np.ndarray]], alpha: float) -> str:
    cover = np.mean([v[0] for v in values])
    fdrs = [v[1] for v in values if v[1] is not None]
    fails = len(values) - len(fdrs)
    if not fdrs:
        return f"cov 0.00 · fails {fails}/{len(values)}"
    above = np.mean([f > alpha for f in fdrs])
    return f"cov {cover:.3f} · FDR {np.mean(fdrs):.3f} · > α in {above:.0%} · fails {fails}/{len(values)}"



def score_split(u: list[np.ndarray], e: list[np.ndarray], alpha: float, cal: np.ndarray,
                samples: np.ndarray) -> dict[str, tuple[float, float | None, float]]:
    """The score rules calibrated on `cal`, measured on the rest: (coverage, FDR or None, generations per question).
    The greedy pass is always run; the samples (`samples`: how many each question's expensive score drew) only
    where the expensive score is asked. `e`: each stage's errors (the same array when both stages answer with one
    greedy answer)."""
    test = ~cal
    alone = [cic.calibrate(x[cal], y[cal], alpha=alpha, delta=DELTA, bound="cp", keep_table=False).threshold
             for x, y in zip(u, e, strict=True)]
    cascade = calibrate_cascade([x[cal] for x in u], [y[cal] for y in e], alpha=alpha, delta=DELTA, bound="cp")
    out = {}
    for rule, thresholds in zip(SCORE_RULES, ((alone[0], None), (None, alone[1]), cascade.thresholds), strict=True):
        answering = answering_model([x[test] for x in u], thresholds)
        answered = answering < 2
        sampled = 0.0 if thresholds[1] is None else float(np.mean(np.where(answering != 0, samples[test], 0)))
        wrong = np.choose(np.minimum(answering, 1), [y[test] for y in e])
        fdr = float(wrong[answered].mean()) if answered.any() else None
        out[rule] = (float(answered.mean()), fdr, 1.0 + sampled)
    return out


def score_cell(values: list[tuple[float, float | None, float]], alpha: float) -> str:
    fdrs = [v[1] for v in values if v[1] is not None]
    cost = np.mean([v[2] for v in values])
    if not fdrs:
        return f"cov 0.00 · cost {cost:.2f} · fails {len(values)}/{len(values)}"
    return (f"cov {np.mean([v[0] for v in values]):.3f} · cost {cost:.2f} · FDR {np.mean(fdrs):.3f} · > α in "
            f"{np.mean([f > alpha for f in fdrs]):.0%} · fails {len(values) - len(fdrs)}/{len(values)}")


def score_cascade(table: pl.DataFrame, model: str, cheap: str, expensive: str, samples: int,
                  masks: list[np.ndarray]) -> None:
    """The second table: one model's cheap score first, its expensive score only where the cheap one declines."""
    pair = table.filter(estimator=cheap).join(table.filter(estimator=expensive), on="question_id", suffix="_x")
    if pair.is_empty():
        sys.exit(f"--cheap {cheap!r} / --expensive {expensive!r}: not both in the tables")
    u = [pair.get_column(f"score_{model}").to_numpy(), pair.get_column(f"score_{model}_x").to_numpy()]
    e = [pair.get_column(f"error_{model}").to_numpy(), pair.get_column(f"error_{model}_x").to_numpy()]
    counted = "generations_x" in pair.columns and pair.get_column("generations_x").null_count() == 0
    drawn = (pair.get_column("generations_x").to_numpy() - 1 if counted
             else np.full(pair.height, samples))  # the table's own count (an adaptive score's varies), greedy aside
    print(f"\nScore cascade, {model}: {cheap} (the greedy pass, cost 1) first, {expensive} ({drawn.mean():.2f} "
          f"samples a question, {'as the table counts' if counted else '--samples'}) only "
          f"where the first declines; same splits, δ = {DELTA}, Clopper–Pearson, default search. Coverage · "
          "generations per question · mean test FDR · P(test FDR > α) · fails:\n")
    print("| rule | " + " | ".join(f"α = {a:g}" for a in ALPHAS) + " |")
    print("|---|" + "---|" * len(ALPHAS))
    per_alpha = {a: [score_split(u, e, a, cal, drawn) for cal in masks] for a in ALPHAS}
    for rule in SCORE_RULES:
        print(f"| {rule} | " + " | ".join(score_cell([s[rule] for s in per_alpha[a]], a) for a in ALPHAS) + " |")
    print(target_line(per_alpha[TARGET_ALPHA], 1.0 + float(drawn.mean())))


TARGET_ALPHA = 0.25


def target_line(splits_at: list[dict[str, tuple[float, float | None, float]]], sampled_cost: float) -> str:
    """The target at α = 0.25: the cascade answers at least what the expensive score alone does, at no more than
    half the expensive score's cost (every question sampled: 1 + its samples)."""
    cover = {rule: float(np.mean([s[rule][0] for s in splits_at])) for rule in SCORE_RULES}
    cost = float(np.mean([s[SCORE_RULES[2]][2] for s in splits_at]))
    more, cheaper = cover[SCORE_RULES[2]] >= cover[SCORE_RULES[1]], cost <= sampled_cost / 2
    return (f"\nTarget at α = {TARGET_ALPHA:g}: the cascade answers {cover[SCORE_RULES[2]]:.3f} against "
            f"{cover[SCORE_RULES[1]]:.3f} for the expensive score alone ({'met' if more else 'not met'}), at "
            f"{cost:.2f} generations a question against {sampled_cost:.2f} ({'met' if cheaper else 'not met'}: "
            f"<= half); the cheap score alone answers {cover[SCORE_RULES[0]]:.3f} at 1.")


def splits(n: int, count: int) -> list[np.ndarray]:
    """`count` random 50/50 calibration masks over `n` questions (seed 0)."""
    rng = np.random.default_rng(0)
    masks = []
    for _ in range(count):
        cal = np.zeros(n, dtype=bool)
        cal[rng.permutation(n)[: n // 2]] = True
        masks.append(cal)
    return masks


def open_ended(args: argparse.Namespace) -> None:
    """The score cascade on an open-ended dataset: the one-pass score from `--one-pass` (a run that drew no more
    than the greedy answer) first, the committed table's sampled score where it declines; each stage answers with
    its own run's greedy answer and label (how often the two agree is printed)."""
    model = "qwen2.5-coder-1.5b"
    where = {"dataset": args.dataset, "criterion": args.criterion}
    sampled = pl.read_parquet(args.table or TABLES[model]).filter(**where)
    cheap = pl.read_parquet(args.one_pass).filter(**where)
    if sampled.is_empty() or cheap.is_empty():
        sys.exit(f"--dataset {args.dataset!r} --criterion {args.criterion!r}: not in both tables")
    greedy = cheap.group_by("question_id").agg(pl.col("error").first()).join(
        sampled.group_by("question_id").agg(pl.col("error").first()), on="question_id", suffix="_sampled")
    agree = int((greedy.get_column("error") == greedy.get_column("error_sampled")).sum())
    print(f"{args.dataset}, {args.criterion}: {greedy.height:,} questions in both runs; their greedy answers' "
          f"labels agree on {agree:,} ({agree / greedy.height:.1%}); base error rate "
          f"{greedy.get_column('error').mean():.3f} (one-pass run) / {greedy.get_column('error_sampled').mean():.3f}")
    both = (cheap,) if args.table is not None and args.table.resolve() == args.one_pass.resolve() else (cheap, sampled)
    table = pl.concat([t.select("estimator", "question_id", pl.col("score").alias(f"score_{model}"),
                                pl.col("error").alias(f"error_{model}"),
                                pl.col("generations") if "generations" in t.columns else pl.lit(None, pl.Int64)
                                .alias("generations")) for t in both])
    masks = splits(greedy.height, args.splits)
    score_cascade(table.filter(pl.col("question_id").is_in(greedy.get_column("question_id").to_list())).sort(
        "estimator", "question_id"), model, args.cheap, args.expensive, args.samples, masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimator", default="one_minus_max_prob", help="both models' score in the cascade")
    parser.add_argument("--splits", type=int, default=100)
    parser.add_argument("--cheap", default="one_minus_max_prob", help="the score cascade's first stage")
    parser.add_argument("--expensive", default="semantic_entropy[embedding:0.9]", help="its second stage")
    parser.add_argument("--samples", type=int, default=10, help="generations the expensive score needs")
    parser.add_argument("--dataset", default="commonsense_qa", help="another: the score cascade alone (Qwen)")
    parser.add_argument("--criterion", default="similarity[0.6]", help="with --dataset: the labels used")
    parser.add_argument("--one-pass", type=Path, help="with --dataset: the one-pass run's long table "
                        "(`cic run --config example_one_pass`, exported)")
    parser.add_argument("--table", type=Path, help="with --dataset: the sampled scores' long table (default: the "
                        "committed one); the same file as --one-pass when one run scored both")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.dataset != "commonsense_qa":
        if args.one_pass is None:
            sys.exit("--dataset other than commonsense_qa needs --one-pass TABLE")
        open_ended(args)
        print(f"\n({time.perf_counter() - started:.0f} s)")
        return
    table, models = joined()
    rows = table.filter(estimator=args.estimator)
    if rows.is_empty():
        sys.exit(f"--estimator {args.estimator!r}: not in the tables")
    us = [rows.get_column(f"score_{m}").to_numpy() for m in models]
    es = [rows.get_column(f"error_{m}").to_numpy() for m in models]
    auto = {name: (g.get_column(f"score_{models[1]}").to_numpy(), g.get_column(f"error_{models[1]}").to_numpy())
            for (name,), g in table.group_by("estimator", maintain_order=True)}
    n = us[0].shape[0]
    prr = [prediction_rejection_ratio(u, e) for u, e in zip(us, es, strict=True)]
    print(f"CommonsenseQA validation, {n:,} questions, option match; estimator {args.estimator} "
          f"(PRR {models[0]} {prr[0]:.2f}, {models[1]} {prr[1]:.2f}); base error rate "
          f"{es[0].mean():.3f} / {es[1].mean():.3f}; {args.splits} random 50/50 splits, δ = {DELTA}, "
          "Clopper–Pearson, default search.\n")
    print("| rule | " + " | ".join(f"α = {a:g}" for a in ALPHAS) + " |")
    print("|---|" + "---|" * len(ALPHAS))
    masks = splits(n, args.splits)
    per_alpha = {a: [run_split(us, es, auto, a, cal) for cal in masks] for a in ALPHAS}
    for rule in RULES:
        print(f"| {rule} | " + " | ".join(cell([s[rule] for s in per_alpha[a]], a) for a in ALPHAS) + " |")
    print("\nCascade shares (SmolLM2 / Qwen, mean over splits): " + ", ".join(
        f"α = {a:g}: " + " / ".join(f"{x:.2f}" for x in np.mean([s[RULES[2]][2] for s in per_alpha[a]], axis=0))
        for a in ALPHAS))
    cascade = {a: calibrate_cascade(us, es, alpha=a, delta=DELTA, bound="cp", models=models) for a in ALPHAS}
    print("\nDeployable cascades calibrated on all questions:")
    for a in ALPHAS:
        print(f"- α = {a:g}: {cascade[a].summary()}")
    score_cascade(table, models[1], args.cheap, args.expensive, args.samples, masks)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
