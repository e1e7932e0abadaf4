"""What a server says about its engine, and what its log-probabilities are (`cic.llm.served_engine`), on the
replies the real servers give (their shapes as their sources write them)."""

from __future__ import annotations

import math

import pytest

from cic.llm.served_engine import RAW, SCALED, engine_name, logprob_semantics, server_root


def test_the_engine_and_version_are_read_from_each_servers_own_route_and_listing() -> None:
    def listing(owner: object) -> dict:
        return {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owner}]}

    assert engine_name(listing("vllm"), {"/version": {"version": "0.11.2"}}) == "vllm 0.11.2"
    assert engine_name(listing("sglang"), {"/server_info": {"version": "0.5.4", "tp_size": 1}}) == "sglang 0.5.4"
    assert engine_name(listing("llamacpp"), {"/props": {"build_info": "b7031-4aa2f1c"}}) == "llama.cpp b7031-4aa2f1c"
    assert engine_name(listing("library"), {"/api/version": {"version": "0.12.6"}}) == "ollama 0.12.6"
    assert engine_name(listing("me"), {"/openapi.json": {"info": {"title": "🦙 llama.cpp Python API",
                                                                 "version": "0.3.16"}}}) == "llama-cpp-python 0.3.16"
    assert engine_name(listing("m"), {"/info": {"version": "3.3.6", "model_id": "m"}}) == "tgi 3.3.6"
    # any FastAPI server has /openapi.json: it names no engine unless the listing does
    assert engine_name(listing("huggingface"), {"/openapi.json": {"info": {"version": "0.1.0"}}}) is None
    assert engine_name(listing(["hf", "m"]), {}) is None  # `transformers serve` writes a list there
    assert engine_name(listing("vllm"), {}) == "vllm"  # the listing alone: the engine without its version
    assert engine_name(None, {"/version": {"version": ""}}) is None
    assert server_root("http://h:8000/v1/") == "http://h:8000" and server_root("http://h/api") == "http://h/api"


def _top(z: list[float], temperature: float = 1.0, k: int = 5) -> dict[str, float]:
    scaled = [v / temperature for v in z]
    norm = math.log(sum(math.exp(v) for v in scaled))
    return dict(sorted(((f"t{i}", v - norm) for i, v in enumerate(scaled)), key=lambda e: -e[1])[:k])


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.5])
def test_raw_and_temperature_scaled_log_probabilities_are_told_apart_by_their_gaps(temperature: float) -> None:
    z = [3.0, 2.1, 1.4, 0.2, -0.5, -1.7, -3.0]
    assert logprob_semantics(_top(z), _top(z), temperature) == RAW
    assert logprob_semantics(_top(z), _top(z, temperature), temperature) == SCALED


def test_semantics_are_not_guessed_where_the_answers_cannot_tell() -> None:
    z = [3.0, 2.1, 1.4]
    assert logprob_semantics(_top(z), _top(z, 1.02), 1.02) is None  # T ≈ 1: raw and scaled agree
    assert logprob_semantics(_top(z), _top(z, 0.5), 0.0) is None  # greedy
    assert logprob_semantics(_top([1.0, 1.02]), _top([1.0, 1.02], 0.5), 0.5) is None  # a gap too small to read
    assert logprob_semantics({"a": -0.1}, {"a": -0.01}, 0.5) is None  # one shared token: no gap at all
    assert logprob_semantics(None, _top(z), 0.5) is None
    assert logprob_semantics(_top(z), {"t0": -0.1, "t2": -0.2}, 0.5) is None  # a ratio near neither 1 nor 1/T
    # tokens only one side lists are ignored: the gap is read on tokens both list
    assert logprob_semantics({**_top(z), "x": -9.0}, _top(z, 0.5), 0.5) == SCALED
