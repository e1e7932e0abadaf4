"""Which engine serves a model, and what its log-probabilities mean, read from the server's own answers.

Engines differ in ways the model's name does not show: vLLM returns log-probabilities of the raw logits by default,
SGLang returns them after temperature scaling, so one model gives different token-logprob scores at T ≠ 1 by
server. A run is keyed on both (`cic.llm.engines.endpoint`), so runs that differ are never mixed. Pure functions:
the HTTP reads are the client's (`cic.llm.endpoint`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# (route under the server's root, engine, path of the version in its JSON): the first that answers names the engine
VERSION_ROUTES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("/version", "vllm", ("version",)),               # vLLM
    ("/server_info", "sglang", ("version",)),         # SGLang (older releases: /get_server_info)
    ("/get_server_info", "sglang", ("version",)),
    ("/props", "llama.cpp", ("build_info",)),         # upstream llama-server: "b<build>-<hash>"
    ("/api/version", "ollama", ("version",)),         # Ollama (its OpenAI layer is under /v1)
    ("/info", "tgi", ("version",)),                   # text-generation-inference (in maintenance mode)
    ("/openapi.json", "", ("info", "version")),       # any FastAPI server: counted only where the listing names it
)
# `owned_by` of a `GET /models` entry, where it names the engine
OWNERS: Mapping[str, str] = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "library": "ollama",
                             "me": "llama-cpp-python"}
RAW, SCALED = "raw", "temperature-scaled"
MIN_GAP = 0.1  # nats between two tokens' log-probabilities at T = 1 below which their ratio tells nothing


def server_root(base: str) -> str:
    """The server's root from its OpenAI base URL (…/v1 dropped): where engines put their own routes."""
    base = base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def engine_name(listing: Any, versions: Mapping[str, Any]) -> str | None:
    """"<engine> <version>" from a `GET /models` reply and the JSON of the VERSION_ROUTES that answered (route →
    body); the engine alone where no version is given, None where nothing names it."""
    owner = None
    entries = listing.get("data") if isinstance(listing, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("owned_by"), str) and entry["owned_by"] in OWNERS:
            owner = OWNERS[entry["owned_by"]]
            break
    for route, engine, path in VERSION_ROUTES:
        version: Any = versions.get(route)
        for key in path:
            version = version.get(key) if isinstance(version, dict) else None
        if isinstance(version, str | int) and str(version).strip() and (engine or owner):
            return f"{owner or engine} {str(version).strip()}"
    return owner


def logprob_semantics(at_one: Mapping[str, float] | None, at_t: Mapping[str, float] | None,
                      temperature: float) -> str | None:
    """Whether a server's log-probabilities are of the raw logits or after temperature scaling, from the first
    token's top log-probabilities of one prompt asked at temperature 1 (`at_one`) and at `temperature`: the gap
    between two tokens is (z_i − z_j) raw and (z_i − z_j) / T scaled, so the ratio of the gaps says which. None
    where it cannot tell: no or too few shared tokens, their gap under MIN_GAP, a ratio near neither, or T ≈ 1."""
    if not at_one or not at_t or temperature <= 0 or abs(math.log(temperature)) < 0.05:
        return None
    shared = [token for token in at_one if token in at_t and math.isfinite(at_one[token])
              and math.isfinite(at_t[token])]
    if len(shared) < 2:
        return None
    top = max(shared, key=lambda t: at_one[t])
    other = min(shared, key=lambda t: at_one[t])
    gap_one, gap_t = at_one[top] - at_one[other], at_t[top] - at_t[other]
    if gap_one < MIN_GAP or gap_t <= 0:
        return None
    ratio = math.log(gap_t / gap_one)  # 0 raw, −log T scaled
    margin = abs(math.log(temperature)) / 3
    if abs(ratio) < margin:
        return RAW
    if abs(ratio + math.log(temperature)) < margin:
        return SCALED
    return None
