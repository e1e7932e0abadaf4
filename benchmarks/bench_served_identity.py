"""What CIC's probe reads from a real OpenAI-compatible server, and how stable its identity check is there.

    .venv/bin/python benchmarks/bench_served_identity.py --url http://127.0.0.1:8711/v1 --model m

Prints the probe's line (engine and version, raw or temperature-scaled log-probabilities at `--temperature`,
whether `n` is honoured, the identity check's greedy answer), then asks the identity check (the canary prompt,
greedy, with log-probabilities) `--repeats` times one after another and `--repeats` times while `--load`
other requests are in flight, and prints how far its text and summed log-probability move: the tolerance
`cic.llm.endpoint.CANARY_LOGPROB_TOLERANCE` must exceed what one model shows, and the text must not move. Finally
`--storm` requests with a `--storm-timeout-s` far below the server's reply time: how many requests the server was
sent for them (retries included) — what a short timeout costs a server that keeps working on abandoned requests.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def canaries(client: object, url: str, repeats: int, load: int) -> list[dict]:
    """The canary asked `repeats` times one after another, with `load` other greedy requests in flight beside."""
    async with client._client() as http:  # type: ignore[attr-defined]
        busy = [asyncio.create_task(client.post(http, url, client._body(  # type: ignore[attr-defined]
            f"Write a sentence about the number {i}.", temperature=0.0, top_p=1.0, max_tokens=24, seed=i, stop=(),
            logprobs=False))) for i in range(load)]
        found = []
        for _ in range(repeats):
            found.append(await client._canary(http, url))  # type: ignore[attr-defined]
        await asyncio.gather(*busy, return_exceptions=True)
    return found


def spread(found: list[dict]) -> str:
    texts = {c["text"] for c in found if c}
    sums = [c["logprob_sum"] for c in found if c and c["logprob_sum"] is not None]
    moved = max(sums) - min(sums) if sums else float("nan")
    first = f", summed log-probability {sums[0]:.6f}" if sums else ""
    return f"{len(found)} asked, {len(texts)} distinct text(s), range {moved:.6f}{first}"


def storm(url: str, model: str, requests: int, timeout_s: float, retries: int) -> str:
    """`requests` answers asked with a timeout the server cannot meet: the requests sent, the questions lost."""
    from cic.llm.endpoint import EndpointClient
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.endpoint_spec import EndpointSpec
    from cic.llm.generation import GenerationConfig

    client = EndpointClient(EndpointSpec(urls=(url,), model=model, timeout_s=timeout_s, retries=retries,
                                         logprobs="off", server_n="off", max_in_flight=4))
    client.probe()
    before = client.stats.requests
    started = time.monotonic()
    generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=64))
    generator.generate_open([f"q{i}" for i in range(requests)],
                            [f"Write a long story about the number {i}." for i in range(requests)], run_key="storm")
    sent = client.stats.requests - before
    return (f"{requests} questions x 2 requests at timeout {timeout_s:g} s, {retries} retries: {sent} requests sent, "
            f"{client.stats.retries} retries, {len(client.stats.failed_questions)} questions lost, "
            f"{time.monotonic() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--load", type=int, default=6)
    parser.add_argument("--storm", type=int, default=0)
    parser.add_argument("--storm-timeout-s", type=float, default=0.5)
    parser.add_argument("--storm-retries", type=int, default=4)
    args = parser.parse_args()

    from cic.llm.endpoint import CANARY_LOGPROB_TOLERANCE, EndpointClient
    from cic.llm.endpoint_spec import EndpointSpec

    client = EndpointClient(EndpointSpec(urls=(args.url,), model=args.model))
    client.probe(n_samples=3, temperature=args.temperature)
    print(f"probe: {client.describe()}")
    print(f"  engine {client.engine!r}; log-probabilities at T={args.temperature:g}: {client.logprobs_as!r}; "
          f"n honoured: {client.server_n}")
    alone = asyncio.run(canaries(client, args.url, args.repeats, 0))
    print(f"identity check alone:       {spread(alone)}")
    loaded = asyncio.run(canaries(client, args.url, args.repeats, args.load))
    print(f"identity check under load:  {spread(loaded)} ({args.load} requests in flight beside)")
    print(f"  tolerance in use: {CANARY_LOGPROB_TOLERANCE:g}")
    if args.storm:
        print(f"short timeouts: {storm(args.url, args.model, args.storm, args.storm_timeout_s, args.storm_retries)}")


if __name__ == "__main__":
    main()
