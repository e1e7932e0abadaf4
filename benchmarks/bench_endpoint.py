"""CIC's endpoint engine against a minimal async client: same server, same requests, same concurrency.

    .venv/bin/python benchmarks/bench_endpoint.py [--questions 16] [--samples 4] [--new-tokens 16]
        [--in-flight 4] [--repeats 3] [--url http://host:8000/v1 --model NAME]

Without --url it starts `transformers serve` with SmolLM2-135M-Instruct on loopback (CPU, the model the tests
serve); with --url it drives a server already running (vLLM or SGLang on a GPU, say). Both sides send the same
request bodies — for each of the demo TriviaQA questions the greedy answer and `--samples` samples, as chat
messages built by CIC's prompt builder — at most `--in-flight` at once. CIC's side is
`EndpointGenerator.generate_open` (requests, retries bookkeeping, parsing, GENERATIONS rows); the minimal client is
httpx + a semaphore + `json()`. The sides alternate, `--repeats` runs each, after a warm-up; the table gives the
median requests/s and completion tokens/s of each, and CIC's overhead = 1 - CIC's tokens/s ÷ the minimal client's
(the server samples, so the two sides' answers and token counts differ a little: tokens/s is the fair rate).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cic.data import build_messages, load_questions  # noqa: E402
from cic.llm.endpoint import CANARY_EVERY, EndpointClient  # noqa: E402
from cic.llm.endpoint_generator import EndpointGenerator  # noqa: E402
from cic.llm.endpoint_spec import EndpointSpec, sample_seed  # noqa: E402
from cic.llm.generation import GenerationConfig  # noqa: E402
from cic.llm.paths import cache_dir  # noqa: E402


def demo_prompts(n_questions: int) -> tuple[list[str], list[Any]]:
    """Question ids and chat messages of the first `n_questions` demo TriviaQA questions."""
    frame = load_questions("trivia_qa", None, limit=n_questions, seed=0)
    ids = [str(q) for q in frame.get_column("question_id").to_list()]
    return ids, [build_messages(row) for row in frame.iter_rows(named=True)]


def request_bodies(client: EndpointClient, config: GenerationConfig, ids: list[str],
                   prompts: list[Any]) -> list[dict[str, Any]]:
    """Exactly the bodies CIC sends: the greedy answer and the samples of every question."""
    return [client._body(prompt, temperature=config.most_likely_temperature if i == 0 else config.temperature,
                         top_p=config.top_p, max_tokens=config.max_new_tokens, seed=sample_seed(config.seed, qid, i),
                         stop=("\n",) if config.stop_at_newline else (), logprobs=client.logprobs)
            for qid, prompt in zip(ids, prompts, strict=True) for i in range(config.n_samples + 1)]


async def minimal_client(url: str, bodies: list[dict[str, Any]], in_flight: int) -> tuple[int, int]:
    """The baseline: POST every body, at most `in_flight` at once; (requests, completion tokens)."""
    import httpx

    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=in_flight + 4)) as client:
        async def one(body: dict[str, Any]) -> int:
            async with gate:
                reply = await client.post(url.rstrip("/") + "/chat/completions", json=body)
                reply.raise_for_status()
                return int(reply.json().get("usage", {}).get("completion_tokens") or 0)

        tokens = await asyncio.gather(*(one(body) for body in bodies))
    return len(bodies), sum(tokens)


CANARIES: list[tuple[int, int]] = []  # CIC's side: (identity checks, requests) of each run


def cic_side(spec: EndpointSpec, state: dict[str, Any], config: GenerationConfig, ids: list[str],
             prompts: list[Any]) -> tuple[int, int]:
    """CIC's engine over the same questions, identity check included; (requests, completion tokens)."""
    client = EndpointClient(spec, seed=config.seed)
    client.adopt(state)  # probed once before timing (as a run's workers adopt its probe); the checks after a batch run
    client.logprobs = False
    frame = EndpointGenerator(client, config).generate_open(ids, prompts, run_key="bench")
    if client.stats.failed_questions:
        raise SystemExit(f"CIC failed questions: {client.stats.failed_questions}")
    assert frame.height == len(ids) * (config.n_samples + 1), frame.height
    CANARIES.append((client.stats.canaries, client.stats.requests))
    return client.stats.requests, client.stats.completion_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", help="a running server's base URL (…/v1); default: start transformers serve")
    parser.add_argument("--model", help="the served model's name (with --url)")
    args = parser.parse_args()

    server = None
    if args.url is None:
        from tests.support.served_model import ServedModel, served_copy

        root = Path(tempfile.mkdtemp(prefix="cic-bench-endpoint-"))
        server = ServedModel(served_copy(str(cache_dir()), root), root / "server.log").start()
        url, model = server.url, server.model
    else:
        url, model = args.url, args.model or ""
    try:
        spec = EndpointSpec(urls=(url,), model=model, max_in_flight=args.in_flight, logprobs="off")
        config = GenerationConfig(n_samples=args.samples, max_new_tokens=args.new_tokens)
        ids, prompts = demo_prompts(args.questions)
        probe = EndpointClient(spec)
        served = probe.probe()
        bodies = request_bodies(probe, config, ids, prompts)

        sides = {"minimal client": lambda: asyncio.run(minimal_client(url, bodies, args.in_flight)),
                 "CIC engine": lambda: cic_side(spec, probe.state(), config, ids, prompts)}
        asyncio.run(minimal_client(url, bodies[:2 * args.in_flight], args.in_flight))  # warm the server up
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, run in sides.items():
                started = time.perf_counter()
                requests, tokens = run()
                seconds = time.perf_counter() - started
                rates[name].append((requests / seconds, tokens / seconds))
    finally:
        if server is not None:
            server.kill()

    print(f"{len(bodies)} requests ({args.questions} questions × {args.samples + 1}), ≤ {args.new_tokens} new "
          f"tokens, {args.in_flight} in flight, alternating, median of {args.repeats}; server {url} ({served})")
    print("| side | requests/s | completion tokens/s |")
    print("|---|---:|---:|")
    medians = {}
    for name, values in rates.items():
        medians[name] = (statistics.median(r for r, _ in values), statistics.median(t for _, t in values))
        print(f"| {name} | {medians[name][0]:.2f} | {medians[name][1]:.1f} |")
    overhead = 1 - medians["CIC engine"][1] / medians["minimal client"][1]
    print(f"CIC's overhead (tokens/s): {overhead:+.1%} (target ≤ 10%)")
    checks, requests = CANARIES[-1]
    print(f"identity checks (canary prompt) after the batch: {checks} beside {requests} requests, "
          f"{checks / requests:.1%} (target ≤ 2%; a run checks again about every {CANARY_EVERY} requests)")


if __name__ == "__main__":
    main()
