"""A rate-limiting gateway in front of a real server, as teams put one before their model server (nginx
`limit_req`, an API gateway): it answers the first requests itself — 429 with Retry-After, a 5xx, or a body that
is not JSON — and forwards every other request to the server unchanged.

It can also make the server behind it look like another kind: llama.cpp's server (`listing`: `GET /models` names
the one model it loaded, and `echo`: every reply names the model the request named), or a server that takes `n`
(`n_mode="fan"`: n seeded requests upstream, returned as the n choices of one reply; `"copies"`: one completion
copied n times, as a broken server would)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def gateway(upstream: str, refusals: list[tuple[int, dict[str, str], bytes]], *, after: int = 0,
            dies_after: int | None = None, listing: list[dict[str, Any]] | None = None, echo: str | None = None,
            n_mode: str | None = None, fail_answer: int | None = None, port: int = 0,
            kill: threading.Event | None = None, logprobs_short: tuple[int, int] | None = None,
            models_down: threading.Event | None = None, other_model: threading.Event | None = None,
            routes: dict[str, Any] | None = None, logits: tuple[list[float], bool] | None = None,
            vocab: dict[str, tuple[int, float]] | None = None, listing_delay_s: float = 0.0) -> Iterator[str]:
    """Yields the gateway's base URL (…/v1). The first `after` requests go through; `refusals` are (status,
    headers, body) answered to the next ones in order; later requests go to `upstream` (a base URL …/v1). With
    `dies_after` N it dies as a crashed replica does: request N+1 and every one in flight with it get no reply
    (the connection drops) and it stops listening (connections refused). `listing` is read at every `GET /models`
    (a test changes it to switch the model the gateway says it serves); `echo` is the model the upstream serves:
    every request goes to it whatever name it gives, and the reply names the model the request named.
    `fail_answer` N: the N-th request for an answer (not a one-token probe, not a request for n) gets a 503.
    `port`: listen there (0: any free port; a gateway started again on a dead one's port is that server back).
    `kill`: when set, the gateway dies at once as `dies_after` makes it die (a killed server process).
    `logprobs_short` (K, D): answers (max_tokens > 1) carry token log-probabilities, one entry per token the reply
    counts, as a server that returns them does (their tokens spell the text) — except the first K, which lack their
    last D entries (a proxy that truncates them). `models_down`: while set, `GET /models` answers 500 (the listing
    route failing alone).
    `other_model`: while set, every chat request reaches the server with "Reply in French." after its last message
    — the same name and listing, another behaviour, as other weights started under the same alias would show.
    `routes`: GET paths under the server's root answered with that JSON (an engine's own routes: vLLM's /version).
    `logits` (z, scaled): replies that ask for log-probabilities carry, per generated token, top log-probabilities
    of the fixed logits z — raw (log-softmax of z), or scaled by the request's temperature (of z / T) where
    `scaled`, as vLLM's default and SGLang's sampled requests differ.
    `vocab` (text → (token id, log-probability)): `POST /tokenize` answers a text's id as vLLM's route does, and a
    request naming `logprob_token_ids` gets those tokens among its first token's top log-probabilities, as vLLM
    returns them; other texts tokenize to two ids (not one token). `listing_delay_s`: `GET /models` answers after
    that long (a server busy with a generation, as llama.cpp's answers its listing only between them)."""
    pending: list[tuple[int, dict[str, str], bytes] | None] = [None] * after + list(refusals)
    lock = threading.Lock()
    seen = [0]
    answers = [0]
    dead = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                seen[0] += 1
                if dies_after is not None and seen[0] > dies_after and not dead.is_set():
                    dead.set()
                    threading.Thread(target=stop_listening, args=(server,), daemon=True).start()
            if dead.is_set():
                self.close_connection = True  # no reply: the client sees the connection drop
                return
            asked = json.loads(body)
            if vocab is not None and self.path.endswith("/tokenize"):
                ids = [vocab[asked["prompt"]][0]] if asked.get("prompt") in vocab else [7, 8]
                self._answer(200, {}, json.dumps({"tokens": ids, "count": len(ids)}).encode())
                return
            named = asked.pop("logprob_token_ids", None)
            with lock:  # the client's identity check (its canary prompt) passes: refusals are for the work
                refusal = pending.pop(0) if pending and not _is_canary(asked) else None
                if fail_answer is not None and asked.get("max_tokens", 1) > 1 and "n" not in asked \
                        and not _is_canary(asked):
                    answers[0] += 1
                    if answers[0] == fail_answer:
                        refusal = (503, {}, b'{"error": "replica overloaded"}')
            if refusal is not None:
                status, headers, payload = refusal
            else:
                status, headers, payload = self._forward(asked)
                if logprobs_short is not None and status == 200 and asked.get("max_tokens", 1) > 1:
                    with lock:
                        answers[0] += 0 if _is_canary(asked) else 1
                        short = logprobs_short[1] if answers[0] <= logprobs_short[0] and not _is_canary(asked) else 0
                    payload = _with_logprobs(payload, short)
                if logits is not None and status == 200 and asked.get("logprobs"):
                    payload = _with_top(payload, asked, *logits)
                if named and vocab is not None and status == 200:
                    payload = _with_named(payload, named, vocab)
            self._answer(status, headers, payload)

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            if routes is not None and self.path in routes:
                self._answer(200, {}, json.dumps(routes[self.path]).encode())
                return
            if models_down is not None and models_down.is_set():
                self._answer(500, {}, b'{"error": "listing unavailable"}')
                return
            if listing_delay_s and self.path.rstrip("/").endswith("/models"):
                time.sleep(listing_delay_s)
            if listing is not None and self.path.rstrip("/").endswith("/models"):
                self._answer(200, {}, json.dumps({"object": "list", "data": listing}).encode())
                return
            try:
                with urllib.request.urlopen(upstream.rstrip("/") + self.path.removeprefix("/v1"), timeout=30) as r:
                    self._answer(r.status, {}, r.read())
            except urllib.error.HTTPError as exc:
                self._answer(exc.code, {}, exc.read())

        def _forward(self, request: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
            if other_model is not None and other_model.is_set() and request.get("messages"):
                last = request["messages"][-1]
                request["messages"] = [*request["messages"][:-1],
                                       {**last, "content": f"{last['content']} Reply in French."}]
            n = int(request.pop("n", 1)) if n_mode else 1
            asked = request.get("model")
            if echo:
                request["model"] = echo
            replies = [_post(upstream.rstrip("/") + self.path.removeprefix("/v1"),
                             {**request, "seed": int(request.get("seed", 0)) + i} if n_mode == "fan" else request)
                       for i in range(n if n_mode == "fan" else 1)]
            status, payload = replies[-1] if any(s != 200 for s, _ in replies) else replies[0]
            if status == 200 and (n > 1 or echo):
                merged = json.loads(payload)
                choices = [json.loads(p)["choices"][0] for _, p in replies] if n_mode == "fan" else \
                    [merged["choices"][0]] * n
                merged["choices"] = [{**choice, "index": i} for i, choice in enumerate(choices)]
                if echo:
                    merged["model"] = asked
                payload = json.dumps(merged).encode()
            return status, {}, payload

        def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            for name, value in {"content-type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    if kill is not None:
        def die_when_killed() -> None:
            kill.wait()
            with lock:
                if dead.is_set():
                    return
                dead.set()
            stop_listening(server)

        threading.Thread(target=die_when_killed, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        if kill is not None:
            kill.set()  # the watcher ends (a second shutdown of a stopped server returns at once)
        server.shutdown()
        server.server_close()


def _is_canary(request: dict[str, Any]) -> bool:
    """Whether a request is the client's identity check (its fixed prompt), not a question's answer."""
    from cic.llm.endpoint import CANARY_PROMPT

    return CANARY_PROMPT in json.dumps(request.get("messages") or request.get("prompt") or "")


def _with_logprobs(payload: bytes, short: int) -> bytes:
    """A chat reply with one log-probability entry per generated token (its usage count), less `short` entries: the
    server's own entries where it returns them (llama.cpp), else made up (`transformers serve` returns none)."""
    reply = json.loads(payload)
    tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
    for choice in reply["choices"]:
        own = (choice.get("logprobs") or {}).get("content")
        entries = own if isinstance(own, list) and own else [{"token": piece, "logprob": -0.5, "top_logprobs": []}
                                                             for piece in _pieces(choice, tokens)]
        choice["logprobs"] = {"content": entries[:max(0, len(entries) - short)]}
    return json.dumps(reply).encode()


def _pieces(choice: dict[str, Any], tokens: int) -> list[str]:
    """`tokens` texts that spell the choice's text, as a server's listed tokens do (the last ones empty when the
    text is shorter)."""
    text = str((choice.get("message") or {}).get("content") or choice.get("text") or "")
    cuts = [round(i * len(text) / max(tokens, 1)) for i in range(tokens + 1)]
    return [text[cuts[i]:cuts[i + 1]] for i in range(tokens)]


def _with_top(payload: bytes, asked: dict[str, Any], z: list[float], scaled: bool) -> bytes:
    """A chat reply whose every generated token carries the top log-probabilities of the logits `z` (of z / T
    where `scaled`, T the request's temperature), the top one as the chosen token's."""
    import math

    reply = json.loads(payload)
    temperature = float(asked.get("temperature", 1.0))
    scaled_z = [v / temperature for v in z] if scaled and temperature > 0 else z
    norm = math.log(sum(math.exp(v) for v in scaled_z))
    top = sorted(((f"w{i}", v - norm) for i, v in enumerate(scaled_z)), key=lambda e: -e[1])
    top = top[:int(asked.get("top_logprobs") or 1)]
    tokens = max(1, int((reply.get("usage") or {}).get("completion_tokens") or 1))
    tops = [{"token": t, "logprob": lp} for t, lp in top]
    for choice in reply["choices"]:  # the chosen tokens spell the reply's text, as a server's do
        choice["logprobs"] = {"content": [{"token": piece, "logprob": top[0][1], "top_logprobs": tops}
                                          for piece in _pieces(choice, tokens)]}
    return json.dumps(reply).encode()


def _with_named(payload: bytes, ids: list[int], vocab: dict[str, tuple[int, float]]) -> bytes:
    """The reply with the named token ids' entries added to its first token's top log-probabilities."""
    reply = json.loads(payload)
    extra = [{"token": text, "logprob": logprob} for text, (token, logprob) in vocab.items() if token in ids]
    for choice in reply["choices"]:
        content = (choice.get("logprobs") or {}).get("content") or []
        if content:
            content[0] = {**content[0], "top_logprobs": [*content[0].get("top_logprobs", []), *extra]}
    return json.dumps(reply).encode()


def _post(url: str, request: dict[str, Any]) -> tuple[int, bytes]:
    call = urllib.request.Request(url, data=json.dumps(request).encode(), method="POST",
                                  headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=300) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def stop_listening(server: ThreadingHTTPServer) -> None:
    """Shut a dying gateway down and close its socket, so new connections are refused."""
    server.shutdown()
    server.server_close()
