"""Where a CUDA decode spends its time: one `AnswerGenerator.generate_open` call under `torch.profiler`, the top
operators by GPU time (what docs/speed.md's breakdown of the 1b × 256 case is read from).

    python benchmarks/profile_generation.py --shape 1b --questions 256 [--attention sdpa|eager]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import torch
    from bench_generation import SHAPES, random_llama, random_prompts
    from torch.profiler import ProfilerActivity, profile

    from cic.llm.generation import AnswerGenerator, GenerationConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--questions", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--attention", default="sdpa", help="the model's attention implementation")
    parser.add_argument("--rows", type=int, default=25, help="operators shown")
    args = parser.parse_args()
    loaded = random_llama(args.shape, "cuda", "bfloat16")
    loaded.model.config._attn_implementation = args.attention
    prompts = random_prompts(args.questions, 60, SHAPES[args.shape]["vocab_size"])
    ids = [str(i) for i in range(args.questions)]
    generator = AnswerGenerator(loaded, GenerationConfig(n_samples=10, max_new_tokens=args.new_tokens,
                                                         stop_at_newline=False))
    generator.generate_open(ids[:2], prompts[:2], run_key="warmup")
    generator.forward_s = 0.0
    torch.cuda.synchronize()
    started = time.perf_counter()
    generator.generate_open(ids, prompts, run_key="timed")
    torch.cuda.synchronize()
    print(f"{args.shape} × {args.questions} ({args.attention}): {time.perf_counter() - started:.2f} s wall, "
          f"{generator.forward_s:.2f} s in forward")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        generator.generate_open(ids, prompts, run_key="profiled")
        torch.cuda.synchronize()
    print(profiled.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
