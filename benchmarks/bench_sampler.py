"""One top-p sampling step on flat logits: sorting the vocabulary (float32 path) against counting 16-bit values.

    python benchmarks/bench_sampler.py --device cuda --rows 2816 --vocab 128256     # the 1b × 256 decode step
    .venv/bin/python benchmarks/bench_sampler.py --rows 64 --vocab 32000            # CPU

Both sides get the same bf16 logits (a random-weight model's flat rows: the case where the 1,024 candidates never
hold top_p) and the same counter-based uniforms; the sorting side reads them as float32, as the generator did
before it handed the sampler its model's own dtype. Printed: milliseconds per step (median of --repeats, in the
same run) and the share of rows that drew a token of the same value (ties are ordered by token id on the counting
side and in no fixed order by the sort, so which of several equal-valued tokens is drawn may differ).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn: object, device: str, repeats: int) -> tuple[float, object]:
    """Median milliseconds of `fn()` over `repeats` calls after one warm-up, and its last result."""
    import torch

    result = fn()  # type: ignore[operator]
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = fn()  # type: ignore[operator]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def main() -> None:
    import torch

    from cic.llm import sampling

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--scale", type=float, default=0.5, help="logit standard deviation (small = flat)")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab, generator=generator) * args.scale).to(torch.bfloat16)
    logits = logits.to(args.device)
    keys = sampling.row_keys(0, [str(i) for i in range(args.rows)], 1, args.device)
    width = args.vocab  # the adaptive sampler's wide mode: every row flat
    sort_ms, sorted_draws = timed(lambda: sampling.sample(logits.float(), keys, 0, temperature=1.0, top_p=args.top_p,
                                                          candidates=width), args.device, args.repeats)
    count_ms, counted_draws = timed(lambda: sampling.sample(logits, keys, 0, temperature=1.0, top_p=args.top_p,
                                                            candidates=width), args.device, args.repeats)
    same_value = logits.gather(-1, sorted_draws[:, None]) == logits.gather(-1, counted_draws[:, None])  # type: ignore
    same = float(same_value.float().mean())
    print(f"sampler step, {args.rows} rows x {args.vocab} tokens, bf16 logits (sd {args.scale}), top-p "
          f"{args.top_p}, {args.device}")
    print(f"  sort the vocabulary (float32)   {sort_ms:9.2f} ms")
    print(f"  count 16-bit values             {count_ms:9.2f} ms")
    print(f"  speed-up {sort_ms / count_ms:.1f}x; a token of the same value drawn in {same:.1%} of rows")


if __name__ == "__main__":
    main()
