"""Generation throughput and equivalence-call savings with SmolLM2-135M on CPU.

    .venv/bin/python benchmarks/bench_generation.py [--questions 50] [--loop-questions 4]

1. 50 bundled TriviaQA questions × (1 most-likely + 10 samples): the batched generator (one prefill per
   question, shared KV cache, all rows decoded together) against a one-question-one-sample-at-a-time loop
   of `model.generate` in the same run (the loop runs on a few questions and is reported per question).
2. Equivalence comparisons made by `cluster_answers` on those samples (MiniLM embeddings, τ = 0.9) against
   the K² all-pairs baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--loop-questions", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    import polars as pl
    import torch

    from cic.data import build_prompt, load_questions
    from cic.llm.embeddings import SentenceEmbedder
    from cic.llm.generation import AnswerGenerator, GenerationConfig, generate_for_questions
    from cic.llm.models import OFFLINE_DEFAULT_MODEL, load_causal_lm
    from cic.llm.uncertainty import EmbeddingEquivalence, cluster_answers

    loaded = load_causal_lm(OFFLINE_DEFAULT_MODEL)
    questions = load_questions("trivia_qa", limit=args.questions, seed=0)
    prompts = [build_prompt(r, tokenizer=loaded.tokenizer) for r in questions.iter_rows(named=True)]
    config = GenerationConfig(n_samples=10, max_new_tokens=args.max_new_tokens)

    started = time.perf_counter()
    rows = generate_for_questions(AnswerGenerator(loaded, config), questions, prompts, run_key="bench")
    batched_s = time.perf_counter() - started

    tokenizer, model = loaded.tokenizer, loaded.model
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    started = time.perf_counter()
    for prompt in prompts[:args.loop_questions]:
        encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        for sample in range(1 + config.n_samples):
            torch.manual_seed(sample)
            with torch.inference_mode():
                model.generate(**encoded, max_new_tokens=config.max_new_tokens, do_sample=sample > 0,
                               temperature=config.temperature if sample else None,
                               top_p=config.top_p if sample else None, top_k=None,
                               eos_token_id=[tokenizer.eos_token_id, *newline], pad_token_id=tokenizer.pad_token_id,
                               output_scores=True, return_dict_in_generate=True)
    loop_s = (time.perf_counter() - started) / args.loop_questions * len(prompts)

    print(f"generation: {len(prompts)} TriviaQA questions x (1 + {config.n_samples}) answers, "
          f"max {config.max_new_tokens} new tokens, SmolLM2-135M on CPU")
    print(f"  batched generator : {batched_s:7.1f} s  {len(prompts) / batched_s:6.2f} questions/s")
    print(f"  one-by-one loop   : {loop_s:7.1f} s  {len(prompts) / loop_s:6.2f} questions/s "
          f"(measured on {args.loop_questions} questions, per-question time x {len(prompts)})")
    print(f"  speed-up          : {loop_s / batched_s:.1f}x   (target >= 3x)")

    embedder = SentenceEmbedder()
    equivalence = EmbeddingEquivalence(embedder, 0.9)
    k_total = pairs = 0
    for _, group in rows.filter(pl.col("sample_index") >= 1).group_by("question_id"):
        texts = group.get_column("text").to_list()
        cluster_answers(texts, equivalence)
        k_total += len(texts)
        pairs += len(texts) ** 2
    print(f"equivalence: {equivalence.n_calls} comparisons for {k_total} samples vs {pairs} all pairs (K^2): "
          f"{pairs / max(equivalence.n_calls, 1):.1f}x fewer; vs K(K-1)/2 = {(pairs - k_total) // 2}: "
          f"{(pairs - k_total) / 2 / max(equivalence.n_calls, 1):.1f}x fewer")


if __name__ == "__main__":
    main()
