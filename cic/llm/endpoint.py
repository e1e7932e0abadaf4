"""An OpenAI-compatible server as the answer generator: the model a team serves (vLLM, SGLang, TGI, llama.cpp's
server, `transformers serve`, a hosted API) answers the questions instead of weights CIC loads itself.

Each question gets a most-likely answer (temperature 0, or `most_likely_temperature`) and K samples, one request
each, with a seed derived from (seed, question id, sample index) for servers that honour seeds. Requests run
concurrently on an asyncio client (httpx), at most `max_in_flight` per replica URL, questions spread over the
replicas. Token log-probabilities are asked for unless the server refuses them (`logprobs: auto` probes once);
without them the estimators that need them store null, and the run says so in one line.

Faults: nothing listening is refused at `probe()` within the connect timeout (≤ 5 s) with the URL named; 429
waits for Retry-After; 5xx, timeouts and dropped connections are retried with exponential backoff and full
jitter; a question whose requests still fail is returned as failed (its reason kept), never half-stored. With
several replicas, one that refuses connections or stops answering past its retries is marked down (a warning)
and its requests move to the live ones — at the probe as during the run; only when none is left do they fail.
The API key is read from the environment variable named in the config and never appears in a message.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.llm.endpoint_replies import (
    EndpointError,
    RequestOutcome,
    incomplete_reply,
    parse_choices,
    parse_response,
    usage_tokens,
)
from cic.llm.endpoint_spec import (
    EndpointSpec,
    api_key,
    backoff_s,
    redact,
    retry_after_s,
)
from cic.llm.served_engine import VERSION_ROUTES, engine_name, logprob_semantics, server_root
from cic.llm.served_identity import listed_identity, n_choices_problem

if TYPE_CHECKING:
    import httpx


log = logging.getLogger("cic.endpoint")

Prompt = str | list[dict[str, str]]  # a text prompt, or chat messages (the server applies its own template)

SAMPLER = "endpoint-seeded-v1"  # how samples are drawn: part of the run key
CONNECT_TIMEOUT_S = 5.0
IDENTITY_TIMEOUT_S = 30.0  # the least an identity read waits, whatever endpoint.timeout_s says
IDENTITY_READS = 3  # tries of a replica's `/models` after a batch before it counts as failed
# identity by behaviour: a fixed prompt answered greedily at the probe and again after the first batch and then
# about every CANARY_EVERY requests (<= 2% of a run's requests); another answer is another model, whatever its name
CANARY_PROMPT = "Complete the sentence with one word: The capital of France is"
CANARY_TOKENS = 8
CANARY_EVERY = 50
SEMANTICS_PROMPT = "Name one colour."  # many likely first tokens: their gaps show how temperature acts
SEMANTICS_TOP = 5
CANARY_LOGPROB_TOLERANCE = 0.05  # |difference| of the summed log-probabilities two reads of one model may show


@dataclass
class EndpointStats:
    """What a generator did (summed over its calls): requests, retries, failures, tokens."""

    requests: int = 0
    retries: int = 0
    moved: int = 0  # requests handed to another replica after theirs stopped answering
    canaries: int = 0  # identity checks asked (the canary prompt), beside `requests`
    failed_questions: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class EndpointClient:
    """Async requests to one model's replicas with bounded concurrency, retries and a request budget."""

    def __init__(self, spec: EndpointSpec, *, seed: int = 0) -> None:
        if not spec.urls:
            raise UserError("endpoint.urls is empty: name at least one base URL")
        self.spec = spec
        self.key = api_key(spec)
        self.rng = random.Random(seed)
        self.stats = EndpointStats()
        self.served_model: str | None = None
        self.logprobs = spec.logprobs == "on"
        self.server_n = False  # samples in one request: decided by `check_server_n` before the first batch
        self.n_checked = spec.server_n == "off"
        self.down: dict[str, str] = {}  # replicas that stopped answering (or never did), and why
        self.listed: dict[str, str | None] = {}  # per replica: the identity its /models gives (None: it cannot say)
        self.echoed: set[str] = set()  # the `model` names the replicas answered the probe with
        self.fingerprints: set[str] = set()  # the system_fingerprints they gave, where they give one
        self.canary: dict[str, Any] | None = None  # the probe's greedy answer to CANARY_PROMPT (text, logprob sum)
        self.canary_at = -1  # `stats.requests` when the canary was last asked after a batch (-1: not yet)
        self.engine: str | None = None  # "<engine> <version>" where the server says (`served_engine.engine_name`)
        self.logprobs_as: str | None = None  # raw or temperature-scaled, where measured (`served_engine`)
        self.named_tokens = False  # the server returns log-probabilities of named token ids (vLLM)
        self.option_ids: dict[str, list[int]] = {}  # per option label: its single-token ids ("B", " B")

    def _replica(self, url: str) -> str | None:
        """`url` while it answers, else the next replica (in configured order) that has not stopped; None when none
        is left."""
        urls = list(self.spec.urls)
        start = urls.index(url) if url in urls else 0
        return next((u for u in urls[start:] + urls[:start] if u not in self.down), None)

    def _mark_down(self, url: str, why: str) -> None:
        if url not in self.down:
            self.down[url] = why
            left = [u for u in self.spec.urls if u not in self.down]
            log.warning("endpoint replica %s stopped answering (%s); its requests go to %s", url, why,
                        ", ".join(left) or "no replica: every one is down")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def _path(self) -> str:
        return "/chat/completions" if self.spec.api == "chat" else "/completions"

    def _body(self, prompt: Prompt, *, temperature: float, top_p: float, max_tokens: int, seed: int,
              stop: Sequence[str], logprobs: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.spec.model, "max_tokens": max_tokens, "temperature": temperature,
                                "seed": seed}
        if temperature > 0 and top_p < 1:
            body["top_p"] = top_p
        if stop:
            body["stop"] = list(stop)
        if self.spec.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if logprobs:  # at least one: llama-cpp-python's server returns `logprobs: null` without top_logprobs
                body["logprobs"] = True
                body["top_logprobs"] = max(1, self.spec.top_logprobs)
        else:
            if not isinstance(prompt, str):
                raise UserError("endpoint.api = 'completions' takes a text prompt, not chat messages")
            body["prompt"] = prompt
            if logprobs:
                body["logprobs"] = max(1, self.spec.top_logprobs)
        return body

    def _client(self) -> httpx.AsyncClient:
        import httpx

        limits = httpx.Limits(max_connections=self.spec.max_in_flight * len(self.spec.urls) + 4)
        return httpx.AsyncClient(timeout=httpx.Timeout(self.spec.timeout_s, connect=CONNECT_TIMEOUT_S),
                                 limits=limits, headers=self._headers())

    def _message(self, text: str) -> str:
        return redact(text, self.key)

    async def _post_once(self, client: httpx.AsyncClient, url: str, body: dict[str, Any],
                         timeout: float | None = None) -> Any:
        """One POST: the parsed JSON, or an exception saying whether to retry (EndpointError: do not). `timeout`:
        the reply's, where not the spec's."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        reply = await client.post(self.spec.base(url) + self._path(), json=body, **kwargs)
        if reply.status_code == 200:
            try:
                return reply.json()
            except ValueError:
                raise EndpointError(f"malformed response from {url}: not JSON") from None
        detail = self._message(reply.text.strip().splitlines()[0][:200] if reply.text.strip() else "")
        raise _HttpStatus(reply.status_code, retry_after_s(reply.headers.get("retry-after")),
                          f"{url} answered HTTP {reply.status_code}" + (f": {detail}" if detail else ""))

    async def post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[RequestOutcome]:
        """POST with retries: 429 after Retry-After; 5xx, timeouts, connection errors, and replies that are malformed
        or incomplete (`incomplete_reply`) after backoff — a reply is returned only whole. Every choice of the
        reply (one, or `n` when the body asks for several)."""
        import httpx

        attempt = 0
        while True:
            live = self._replica(url)
            if live is None:
                raise EndpointError(f"every replica stopped answering ({url}: {self.down.get(url, 'down')})")
            if live != url:  # its replica died: the request moves, its retries start afresh
                url, attempt = live, 0
                self.stats.moved += 1
            if self.spec.max_requests is not None and self.stats.requests >= self.spec.max_requests:
                raise EndpointError(f"request budget of {self.spec.max_requests} spent (endpoint.max_requests)")
            if self.spec.max_tokens is not None and self.stats.completion_tokens >= self.spec.max_tokens:
                raise EndpointError(f"token budget of {self.spec.max_tokens} completion tokens spent "
                                    "(endpoint.max_tokens)")
            self.stats.requests += 1
            try:
                reply = await self._post_once(client, url, body)
                outcomes = parse_choices(reply, self.spec.api, url)
                if (gap := incomplete_reply(outcomes, reply, body)) is not None:
                    self.stats.completion_tokens += usage_tokens(reply)[1]  # generated, and spent, all the same
                    raise EndpointError(f"incomplete reply from {url}: {gap}")
            except _HttpStatus as exc:
                if (wait := self._retry_wait(exc, attempt)) is None:
                    raise EndpointError(str(exc)) from None
            except EndpointError as exc:  # the server answered, but not a whole reply: asked again, like a 5xx
                if attempt >= self.spec.retries:
                    raise EndpointError(f"{exc} (after {attempt + 1} attempt(s))") from None
                wait = backoff_s(attempt, self.rng)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                several = len(self.spec.urls) > 1
                if (several and isinstance(exc, httpx.ConnectError)) or attempt >= self.spec.retries:
                    what = (f"no reply within {self.spec.timeout_s:g} s (endpoint.timeout_s)"
                            if isinstance(exc, httpx.ReadTimeout) else type(exc).__name__)
                    if not several:
                        raise EndpointError(f"{url}: {what} after {attempt + 1} attempt(s)") from None
                    self._mark_down(url, f"{what} after {attempt + 1} attempt(s)")
                    continue  # nothing listens there, or it stopped answering: the request moves
                wait = backoff_s(attempt, self.rng)
            else:
                prompt_tokens, completion_tokens = usage_tokens(reply)
                self.stats.prompt_tokens += prompt_tokens
                self.stats.completion_tokens += completion_tokens
                return outcomes
            attempt += 1
            self.stats.retries += 1
            await asyncio.sleep(wait)

    def _retry_wait(self, exc: _HttpStatus, attempt: int) -> float | None:
        """Seconds to wait before retrying after an HTTP error: Retry-After for 429, backoff for 429 without it and
        for 5xx; None when the error is not retried (any other status) or the retries are spent."""
        if not (exc.status == 429 or exc.status >= 500) or attempt >= self.spec.retries:
            return None
        return exc.retry_after if exc.status == 429 and exc.retry_after is not None else backoff_s(attempt, self.rng)

    async def _post_patiently(self, client: httpx.AsyncClient, url: str, body: dict[str, Any],
                              timeout: float | None = None) -> Any:
        """One probe POST that waits out 429 and 5xx like any request: a busy or rate-limited server is not a wrong
        URL."""
        attempt = 0
        while True:
            try:
                return await self._post_once(client, url, body, timeout)
            except _HttpStatus as exc:
                if (wait := self._retry_wait(exc, attempt)) is None:
                    raise
            attempt += 1
            await asyncio.sleep(wait)

    def _probe_body(self, logprobs: bool) -> dict[str, Any]:
        return self._body("Say OK.", temperature=0.0, top_p=1.0, max_tokens=1, seed=0, stop=(), logprobs=logprobs)

    def probe(self, *, n_samples: int = 1, temperature: float = 1.0) -> str:
        """Ask every replica for one token before any work: the identity of the model it serves (the run key holds
        it: from `GET /models`, the echoed name only where the listing cannot say) and whether it returns
        log-probabilities; then, once per run, on the first replica that answers: the engine and its version,
        whether its log-probabilities at `temperature` are raw or scaled, and (for `n_samples` > 1) whether it
        honours `n`. Refuses, within the connect timeout, an endpoint where no replica listens, and replicas that
        serve different models; a replica that does not answer while another does is a warning, and its share of
        the questions goes to the others."""
        return asyncio.run(self._probe(n_samples, temperature))

    async def _probe(self, n_samples: int = 1, temperature: float = 1.0) -> str:
        reported: dict[str, str] = {}
        listings: dict[str, Any] = {}
        unreachable: dict[str, str] = {}
        async with self._client() as client:
            for url in self.spec.urls:
                try:
                    first = await self._probe_one(client, url)
                except _Unreachable as exc:
                    unreachable[url] = str(exc)
                    continue
                outcome = parse_response(first, self.spec.api, url)
                listings[url] = await self._models(client, url)
                self.listed[url] = listed_identity(listings[url], self.spec.model, outcome.model)
                if outcome.model:
                    self.echoed.add(outcome.model)
                if outcome.fingerprint:
                    self.fingerprints.add(outcome.fingerprint)
                reported[url] = self.listed[url] or outcome.model or self.spec.model
                if self.listed[url] is None:
                    _warn_once(url, self.spec.model)
            if not reported:  # not one replica answers: the first reason, one line
                raise UserError(next(iter(unreachable.values())))
            canaries = {url: await self._canary(client, url) for url in reported}
            first_live = next(iter(reported))
            self.engine = await self._engine_name(client, first_live, listings[first_live])
            if self.logprobs:
                self.logprobs_as = await self._logprob_semantics(client, first_live, temperature)
            if self.logprobs and self.spec.option_logprobs == "auto" and (self.engine or "").startswith("vllm"):
                self.named_tokens = bool(await self._token_ids(client, first_live, "A"))
            if n_samples > 1 and not self.n_checked:
                await self.check_server_n(client, first_live)
        for url, why in unreachable.items():  # a dead replica while another answers: a warning, not a refusal
            self._mark_down(url, why.removeprefix(f"endpoint {url}: "))
        models = set(reported.values())
        if len(models) > 1:
            raise UserError("endpoint replicas serve different models: "
                            + ", ".join(f"{u} → {m}" for u, m in reported.items()))
        answers = {c["text"] for c in canaries.values() if c is not None}
        if len(answers) > 1:
            raise UserError("endpoint replicas answer one greedy prompt differently (other weights behind one name?): "
                            + ", ".join(f"{u} → {c['text']!r}" for u, c in canaries.items() if c is not None))
        self.canary = next((c for c in canaries.values() if c is not None), None)
        self.served_model = models.pop()
        return self.served_model

    async def _canary(self, client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
        """A replica's greedy answer to CANARY_PROMPT: its text and summed token log-probabilities (None where the
        server gives none); None when it could not be read (a replica failure, never a switch)."""
        import httpx

        body = self._body(CANARY_PROMPT, temperature=0.0, top_p=1.0, max_tokens=CANARY_TOKENS, seed=0, stop=(),
                          logprobs=self.logprobs)
        self.stats.canaries += 1
        try:
            outcome = parse_response(await self._post_patiently(client, url, body, self._identity_timeout()),
                                     self.spec.api, url)
        except (_HttpStatus, EndpointError, httpx.HTTPError):
            return None
        logprobs = outcome.token_logprobs
        return {"text": outcome.text, "logprob_sum": None if logprobs is None else float(sum(logprobs))}

    async def _engine_name(self, client: httpx.AsyncClient, url: str, listing: Any) -> str | None:
        """The engine and its version (`served_engine.engine_name`) from the listing and the engines' own routes,
        asked in order until one gives a version; None where nothing names it. Each route is asked once, within the
        connect timeout, not retried: a route a server lacks is no failure."""
        import httpx

        root, found = server_root(self.spec.base(url)), {}
        for route, _engine, _path in VERSION_ROUTES:
            try:
                reply = await client.get(root + route, headers={"connection": "close"}, timeout=CONNECT_TIMEOUT_S)
                if reply.status_code == 200:
                    found[route] = reply.json()
            except (httpx.HTTPError, ValueError):
                continue
            if " " in (engine_name(listing, found) or ""):
                break
        return engine_name(listing, found)

    async def _logprob_semantics(self, client: httpx.AsyncClient, url: str, temperature: float) -> str | None:
        """Raw or temperature-scaled log-probabilities (`served_engine.logprob_semantics`): the first token of
        SEMANTICS_PROMPT asked at temperature 1 and at the run's, with the top SEMANTICS_TOP log-probabilities.
        None at temperature 0 or 1 (where the two agree) and where the server's answers cannot tell."""
        if temperature <= 0 or abs(temperature - 1.0) < 0.05:
            return None
        tops = []
        for t in (1.0, temperature):
            body = self._body(SEMANTICS_PROMPT, temperature=t, top_p=1.0, max_tokens=1, seed=0, stop=(),
                              logprobs=True)
            body.update({"top_logprobs": SEMANTICS_TOP} if self.spec.api == "chat" else {"logprobs": SEMANTICS_TOP})
            self.stats.canaries += 1
            try:
                tops.append(parse_response(await self._post_patiently(client, url, body), self.spec.api, url).first_top)
            except (_HttpStatus, EndpointError):
                return None
        return logprob_semantics(tops[0], tops[1], temperature)

    async def _token_ids(self, client: httpx.AsyncClient, url: str, text: str) -> list[int] | None:
        """The server's token ids of `text` (vLLM's `POST /tokenize`, no special tokens); None where it gives none."""
        import httpx

        body = {"model": self.spec.model, "prompt": text, "add_special_tokens": False}
        try:
            reply = await client.post(server_root(self.spec.base(url)) + "/tokenize", json=body,
                                      timeout=CONNECT_TIMEOUT_S)
            tokens = reply.json().get("tokens") if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return [int(t) for t in tokens] if isinstance(tokens, list) and tokens else None

    async def label_token_ids(self, client: httpx.AsyncClient, url: str, labels: Sequence[str]) -> list[int]:
        """The ids of every spelling an answer's first token gives an option label ("B", " B") that is one token,
        asked once per label (cached): what `logprob_token_ids` names so each option's probability is read even
        where it is not among the top-k."""
        ids: list[int] = []
        for label in labels:
            if label not in self.option_ids:
                found = [await self._token_ids(client, url, spelling) for spelling in (label, f" {label}")]
                self.option_ids[label] = sorted({t[0] for t in found if t is not None and len(t) == 1})
            ids.extend(self.option_ids[label])
        return sorted(set(ids))

    def describe(self) -> str:
        """What the probe found, in one line for the run's console and log."""
        parts = [f"serves {self.served_model}", f"engine {self.engine or 'not reported'}"]
        if self.logprobs:
            parts.append(f"log-probabilities {self.logprobs_as or 'returned (raw or scaled: not measured)'}")
        else:
            parts.append("no log-probabilities")
        if self.n_checked and self.spec.server_n != "off":
            parts.append("samples n to a request (the server honours n)" if self.server_n
                         else "samples one seeded request each (n not honoured)")
        if self.named_tokens:
            parts.append("option probabilities from the option letters' own log-probabilities")
        if self.canary is not None:
            parts.append(f"identity check answers {self.canary['text'].strip()[:40]!r}")
        return " · ".join(parts)

    def state(self) -> dict[str, Any]:
        """What the probe found, as plain data: a worker `adopt`s it instead of probing the server again."""
        return {"served_model": self.served_model, "logprobs": self.logprobs, "down": dict(self.down),
                "listed": dict(self.listed), "echoed": sorted(self.echoed), "fingerprints": sorted(self.fingerprints),
                "canary": self.canary, "engine": self.engine, "logprobs_as": self.logprobs_as,
                "server_n": self.server_n, "n_checked": self.n_checked, "named_tokens": self.named_tokens,
                "described": self.describe()}

    def adopt(self, state: dict[str, Any]) -> None:
        """Take over a probe's findings (`state()` of the run's probe): no request is made."""
        self.served_model, self.logprobs = state["served_model"], bool(state["logprobs"])
        self.down, self.listed = dict(state["down"]), dict(state["listed"])
        self.echoed, self.fingerprints = set(state["echoed"]), set(state["fingerprints"])
        self.canary = state.get("canary")
        self.engine, self.logprobs_as = state.get("engine"), state.get("logprobs_as")
        self.named_tokens = bool(state.get("named_tokens"))
        if "n_checked" in state:
            self.server_n, self.n_checked = bool(state["server_n"]), bool(state["n_checked"])

    async def _probe_one(self, client: httpx.AsyncClient, url: str) -> Any:
        """One replica's one-token reply (the log-probability question settled on the way); _Unreachable when
        nothing answers a connection there, a UserError for any other refusal."""
        import httpx

        asked_logprobs = self.spec.logprobs != "off"
        try:
            first = await self._post_patiently(client, url, self._probe_body(asked_logprobs))
        except httpx.ConnectError:
            raise _Unreachable(f"endpoint {url}: nothing is listening there (connection refused)") from None
        except httpx.ConnectTimeout:
            raise _Unreachable(f"endpoint {url}: no answer to a connection within {CONNECT_TIMEOUT_S:g} s") from None
        except httpx.TimeoutException:
            raise UserError(f"endpoint {url}: connected, but no reply within {self.spec.timeout_s:g} s "
                            "(endpoint.timeout_s)") from None
        except _HttpStatus as exc:
            if not (self.spec.logprobs == "auto" and exc.status in (400, 422)):  # maybe only the logprobs
                raise UserError(refusal(exc)) from None
            try:
                first = await self._post_patiently(client, url, self._probe_body(False))
            except _HttpStatus as again:
                raise UserError(refusal(again)) from None
            self.logprobs, asked_logprobs = False, False
            log.info("%s refuses log-probabilities (%s): estimators that need them store null", url, exc)
        except httpx.TransportError as exc:
            raise UserError(f"endpoint {url}: {type(exc).__name__}") from None
        if self.spec.logprobs == "auto" and asked_logprobs:
            self.logprobs = parse_response(first, self.spec.api, url).token_logprobs is not None
        return first

    async def _models(self, client: httpx.AsyncClient, url: str) -> Any:
        """The JSON of `GET /models` on one replica; None where it gives none (no such route, not JSON, down)."""
        import httpx

        try:
            # not kept alive: a server that fails this route may drop the connection the next request would reuse
            reply = await client.get(self.spec.base(url) + "/models", headers={"connection": "close"},
                                     timeout=self._identity_timeout())
            return reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def check_server_n(self, client: httpx.AsyncClient, url: str) -> None:
        """Whether the server honours `n`: three completions of a prompt that asks for random words at temperature
        1 must come back as three choices, indices 0..2, not all one text. Under "auto" a server that refuses or
        fails the check gets seeded single requests (one line says why); under "on" that is a UserError."""
        import httpx

        body = {**self._body("Write three random words.", temperature=1.0, top_p=1.0, max_tokens=8, seed=1,
                             stop=(), logprobs=False), "n": 3}
        try:
            outcomes = parse_choices(await self._post_patiently(client, url, body), self.spec.api, url)
            problem = n_choices_problem([o.index for o in outcomes], [o.text for o in outcomes], 3, distinct=True)
        except (_HttpStatus, EndpointError) as exc:
            problem = str(exc)
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__} on a request for n=3"
        if problem is not None and self.spec.server_n == "on":
            raise UserError(f"endpoint.server_n = 'on', but {url} does not honour n: {problem}")
        self.server_n, self.n_checked = problem is None, True
        log.info("%s: %s", url, "samples come n to a request (the server honours n)" if problem is None else
                 f"samples come one seeded request each (n not honoured: {problem})")

    async def still_serving(self, client: httpx.AsyncClient, outcomes: Sequence[RequestOutcome]) -> None:
        """Refuse a batch served by another model than the probe found: a replica whose `/models` now names
        another model, or a reply that names itself differently or carries another system_fingerprint. Called
        before a batch's rows are returned, so nothing of a switched model is stored under this run. A listing
        that cannot be read (after IDENTITY_READS tries) is a replica failure, not a switch: the batch stands and
        the replica's later requests go to the others."""
        for outcome in outcomes:
            if self.echoed and outcome.model and outcome.model not in self.echoed:
                self._switched(f"the endpoint now answers as {outcome.model!r}")
            if self.fingerprints and outcome.fingerprint and outcome.fingerprint not in self.fingerprints:
                self._switched(f"the endpoint now reports system_fingerprint {outcome.fingerprint!r}, not "
                               f"{' / '.join(sorted(self.fingerprints))!r}")
        for url, identity in self.listed.items():
            if identity is None or url in self.down:
                continue
            listing = await self._models_read(client, url)
            if listing is None:  # unread, not another model: this replica fails, its requests move
                self._mark_down(url, f"its model listing (/models) could not be read {IDENTITY_READS} times")
                continue
            now = listed_identity(listing, self.spec.model, self.spec.model)
            if now != identity:
                self._switched(f"{url} now lists {now!r} in /models" if now else
                               f"{url} no longer says in /models which model it serves")
        await self._same_behaviour(client)

    async def _same_behaviour(self, client: httpx.AsyncClient) -> None:
        """After the first batch and then about every CANARY_EVERY requests, every live replica answers the canary
        prompt again: another text (or log-probabilities beyond the tolerance) is another model behind the same
        name — a switch; a canary that cannot be read fails that replica (its requests move)."""
        if self.canary is None or (self.canary_at >= 0 and self.stats.requests - self.canary_at < CANARY_EVERY):
            return
        self.canary_at = self.stats.requests
        for url in [u for u in self.spec.urls if u not in self.down]:
            now = await self._canary(client, url)
            if now is None:
                self._mark_down(url, "it did not answer the identity check (canary prompt)")
                continue
            if not same_canary(self.canary, now):
                self._switched(f"{url} now answers the identity check (a fixed greedy prompt) with {now['text']!r}"
                               f", not {self.canary['text']!r} — another model behind the same name")

    async def _models_read(self, client: httpx.AsyncClient, url: str) -> Any:
        """`GET /models` asked up to IDENTITY_READS times (backoff between): its JSON, or None when no read
        succeeded (an HTTP error, a timeout, not JSON) — a replica that cannot say, not a switch."""
        for attempt in range(IDENTITY_READS):
            body = await self._models(client, url)
            if body is not None:
                return body
            if attempt + 1 < IDENTITY_READS:
                await asyncio.sleep(backoff_s(attempt, self.rng))
        return None

    def _identity_timeout(self) -> float:
        """The identity reads' wait (`/models`, the canary): never below IDENTITY_TIMEOUT_S, so a timeout set short
        for answers does not fail a replica that is still busy with requests the client gave up on (llama.cpp's
        server answers its listing only between generations)."""
        return max(self.spec.timeout_s, IDENTITY_TIMEOUT_S)

    def _switched(self, what: str) -> None:
        raise UserError(f"{what}; this run is keyed on {self.served_model!r}: this batch is not "
                        "stored — start a new run for the new model")


def same_canary(first: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two answers to the canary prompt come from one model: the same greedy text and, where both carry
    them, summed log-probabilities within CANARY_LOGPROB_TOLERANCE (two reads of one model differ by rounding)."""
    before, after = first.get("logprob_sum"), now.get("logprob_sum")
    return now.get("text") == first.get("text") and (
        before is None or after is None or abs(before - after) <= CANARY_LOGPROB_TOLERANCE)


def _warn_once(url: str, model: str, _warned: set[tuple[str, str]] = set()) -> None:  # noqa: B006 - per process
    if (url, model) not in _warned:
        _warned.add((url, model))
        log.warning("%s does not say in /models which model answers for %r: the run is keyed on the name it answers "
                    "with, and a switch of model behind it is noticed by that name or by its answer to the identity "
                    "check (a fixed greedy prompt)", url, model)


class _Unreachable(Exception):
    """Nothing answers a connection at a replica's URL."""


def refusal(exc: _HttpStatus) -> str:
    """The probe's one line for a server that answered with an error, with what usually fixes it."""
    key = "; is endpoint.api_key_env the variable holding the key, and is it set?"
    hint = {401: key, 403: key,
            404: "; a base URL usually ends in /v1, and endpoint.model must be a model the server serves"}
    return f"endpoint {exc}" + hint.get(exc.status, "")


class _HttpStatus(Exception):
    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after
