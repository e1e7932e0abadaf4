"""Reading an OpenAI-compatible server's replies: completions and chat completions, one choice or several, their
token log-probabilities, the first token's top alternatives (option letters), usage, and whether a reply is
complete (one log-probability per generated token, text spelled by its tokens) — a reply is stored only when it is."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:

    pass


class EndpointError(RuntimeError):
    """A request that failed for good (after its retries) or a response that cannot be read."""


@dataclass
class RequestOutcome:
    """One completion: its text, token log-probabilities (None when the server gave none) and why it stopped."""

    text: str
    token_logprobs: list[float] | None
    finish_reason: str | None
    completion_tokens: int | None
    prompt_tokens: int | None
    model: str
    first_top: dict[str, float] | None = None  # the first token's top log-probabilities (token -> logprob)
    index: int | None = None                   # the choice's index (several when a request asks for n)
    fingerprint: str | None = None             # the reply's system_fingerprint, where the server gives one
    tokens: list[str] | None = None            # the generated tokens' texts, where the server lists them


def parse_response(body: Any, api: str, url: str) -> RequestOutcome:
    """The first choice of a chat or completions response; a malformed one is an EndpointError naming the gap."""
    return parse_choices(body, api, url)[0]


def parse_choices(body: Any, api: str, url: str) -> list[RequestOutcome]:
    """Every choice of a response, in the order given (a request for `n` completions has n). Usage counts are the
    reply's: on the only choice, or on none when there are several (they are summed over all of them)."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise EndpointError(f"malformed response from {url}: no choices")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    single = len(body["choices"]) == 1
    fingerprint = body.get("system_fingerprint")
    outcomes = []
    for i, choice in enumerate(body["choices"]):
        if not isinstance(choice, dict):
            raise EndpointError(f"malformed response from {url}: choices[{i}] is not an object")
        if api == "chat":
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else None
            where = f"choices[{i}].message.content"
        else:
            text = choice.get("text")
            where = f"choices[{i}].text"
        if not isinstance(text, str):
            raise EndpointError(f"malformed response from {url}: no {where}")
        outcomes.append(RequestOutcome(
            text=text, token_logprobs=_token_logprobs(choice.get("logprobs"), api),
            finish_reason=choice.get("finish_reason"),
            completion_tokens=_int_or_none(usage.get("completion_tokens")) if single else None,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")) if single else None,
            model=str(body.get("model", "")), first_top=_first_top(choice.get("logprobs"), api),
            index=choice.get("index") if isinstance(choice.get("index"), int) else None,
            fingerprint=fingerprint if isinstance(fingerprint, str) and fingerprint else None,
            tokens=_listed_tokens(choice.get("logprobs"), api)))
    return outcomes


def incomplete_reply(outcomes: Sequence[RequestOutcome], body: Any, asked: dict[str, Any]) -> str | None:
    """Why a reply cannot be stored as it is (None: it can): fewer or more choices than the request's `n`, or token
    log-probabilities that do not cover the tokens the reply says it generated (`usage.completion_tokens`, over
    every choice), or listed tokens that do not spell the choice's text. A choice that stopped on its own
    (finish_reason "stop") may list one entry fewer, or one more than its text spells: servers differ on whether
    the end-of-sequence token they count is listed — but that slack never lets a content token go missing, since
    where the server lists the tokens they must spell the text. A reply without log-probabilities, or without a
    count, is not judged here (a null log-probability is flagged where the row is made)."""
    wanted = int(asked.get("n", 1))
    if len(outcomes) != wanted:
        return f"{len(outcomes)} choice(s) for n = {wanted}"
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    generated = _int_or_none(usage.get("completion_tokens"))
    if generated is None or not asked.get("logprobs") or any(o.token_logprobs is None for o in outcomes):
        return None
    listed = sum(len(o.token_logprobs or []) for o in outcomes)
    slack = sum(o.finish_reason == "stop" for o in outcomes)
    if not generated - slack <= listed <= generated:
        return f"{listed} token log-probabilities for {generated} generated token(s)"
    for i, outcome in enumerate(outcomes):
        if outcome.tokens is not None and not spells(outcome.tokens, outcome.text, outcome.finish_reason == "stop"):
            return (f"choice {i}: its {len(outcome.tokens)} listed token(s) spell {''.join(outcome.tokens)[:80]!r}, "
                    f"not its text {outcome.text[:80]!r}")
    return None


def spells(tokens: Sequence[str], text: str, stopped: bool) -> bool:
    """Whether listed tokens spell a reply's text (ends' whitespace aside, which some servers trim); a reply that
    stopped on its own may list one more entry, its end-of-sequence token."""
    return "".join(tokens).strip() == text.strip() or (stopped and "".join(tokens[:-1]).strip() == text.strip())


def _listed_tokens(block: Any, api: str) -> list[str] | None:
    """The generated tokens' texts a choice's `logprobs` lists (chat: content[].token, from its `bytes` where every
    entry has them — a token may be part of a character; completions: tokens[]); None where it lists none."""
    if not isinstance(block, dict):
        return None
    if api != "chat":
        tokens = block.get("tokens")
        return [str(t) for t in tokens] if isinstance(tokens, list) and tokens and all(
            isinstance(t, str) for t in tokens) else None
    entries = [t for t in block.get("content") or [] if isinstance(t, dict)]
    if not entries:
        return None
    if all(isinstance(t.get("bytes"), list) and all(isinstance(b, int) and 0 <= b < 256 for b in t["bytes"])
           for t in entries):
        # a character split over tokens has no text of its own: decode all but the last entry (a possible
        # end-of-sequence token) together
        head = b"".join(bytes(t["bytes"]) for t in entries[:-1]).decode("utf-8", errors="replace")
        return [head, bytes(entries[-1]["bytes"]).decode("utf-8", errors="replace")]
    if not all(isinstance(t.get("token"), str) for t in entries):
        return None
    return [t["token"] for t in entries]


def usage_tokens(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens a reply's `usage` counts (0 where it gives none)."""
    usage = body.get("usage") if isinstance(body, dict) and isinstance(body.get("usage"), dict) else {}
    return _int_or_none(usage.get("prompt_tokens")) or 0, _int_or_none(usage.get("completion_tokens")) or 0


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _first_top(block: Any, api: str) -> dict[str, float] | None:
    """The first generated token's top log-probabilities (chat: content[0].top_logprobs; completions:
    top_logprobs[0]); None when the server gave none."""
    if not isinstance(block, dict):
        return None
    if api == "chat":
        content = block.get("content") or []
        first = content[0].get("top_logprobs") if content and isinstance(content[0], dict) else None
        pairs = [(t.get("token"), t.get("logprob")) for t in first or [] if isinstance(t, dict)]
    else:
        tops = block.get("top_logprobs") or []
        pairs = list(tops[0].items()) if tops and isinstance(tops[0], dict) else []
    top = {str(token): float(lp) for token, lp in pairs
           if isinstance(token, str) and isinstance(lp, int | float) and math.isfinite(lp)}
    return top or None


def option_probs_from_top(top: dict[str, float] | None, labels: Sequence[str]) -> list[float] | None:
    """Option probabilities from the first token's top log-probabilities: each label's best-matching token
    (" B", "B", "(B" ...), renormalised over the labels; None when no label is among them."""
    if not top:
        return None
    best: dict[str, float] = {}
    for token, logprob in top.items():
        label = token.strip().lstrip("(").rstrip(").:").upper()
        if label in labels:
            best[label] = max(best.get(label, -math.inf), logprob)
    if not best:
        return None
    peak = max(best.values())
    weights = [math.exp(best[label] - peak) if label in best else 0.0 for label in labels]
    total = sum(weights)
    return [w / total for w in weights]


def option_letter(text: str, labels: Sequence[str]) -> str:
    """The option a free-text answer names: its first word without brackets or punctuation, when that is a label
    ("B", "(B)", "B." -> "B"); otherwise the text as it is (the criterion then counts it as not the answer)."""
    words = text.strip().split()
    head = words[0].strip("().:,").upper() if words else ""
    return head if head in labels else text.strip()


def _token_logprobs(block: Any, api: str) -> list[float] | None:
    """Per-token log-probabilities from a choice's `logprobs` (chat: content[].logprob; completions:
    token_logprobs[]); None when absent or not numbers."""
    if not isinstance(block, dict):
        return None
    values = ([t.get("logprob") for t in block.get("content") or [] if isinstance(t, dict)] if api == "chat"
              else list(block.get("token_logprobs") or []))
    if not values or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values]
