"""Where a served model answers and how CIC asks it: the endpoint's spec (picklable: it crosses into Ray actors),
the API key read from the variable the config names (never shown: `redact`), Retry-After and full-jitter backoff,
and the seed each request carries."""

from __future__ import annotations

import email.utils
import math
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cic import schema
from cic.errors import UserError

if TYPE_CHECKING:
    pass



BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
MAX_RETRY_AFTER_S = 300.0


@dataclass(frozen=True)
class EndpointSpec:
    """Where a served model answers and how to talk to it (picklable: it crosses into Ray actors)."""

    urls: tuple[str, ...]
    model: str
    api: str = "chat"                 # "chat" (/chat/completions) or "completions" (/completions)
    api_key_env: str | None = None    # the NAME of the environment variable holding the key
    timeout_s: float = 120.0
    retries: int = 4
    max_in_flight: int = 8            # per replica URL
    max_requests: int | None = None   # a budget: no request beyond it in one call
    max_tokens: int | None = None     # a budget of completion tokens: no request once they are spent
    logprobs: str = "auto"            # "auto" | "on" | "off"
    top_logprobs: int = 0
    server_n: str = "auto"            # samples in one request with `n`: "auto" (where honoured) | "on" | "off"
    option_logprobs: str = "auto"     # option letters' own log-probabilities where the server takes token ids

    def base(self, url: str) -> str:
        return url.rstrip("/")


def api_key(spec: EndpointSpec) -> str | None:
    """The key from the environment variable the config names (an unset variable is an error naming it)."""
    if spec.api_key_env is None:
        return None
    value = os.environ.get(spec.api_key_env)
    if not value:
        raise UserError(f"endpoint.api_key_env = {spec.api_key_env!r}: that environment variable is not set")
    return value


def redact(text: str, secret: str | None) -> str:
    """`text` with the key replaced (a server may echo request headers into an error body)."""
    return text.replace(secret, "***") if secret else text


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), capped; None if absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if math.isfinite(seconds) else None


def backoff_s(attempt: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2^attempt)]."""
    return rng.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempt))


def sample_seed(seed: int, question_id: str, sample_index: int) -> int:
    """The request seed of one row: stable across runs and machines, distinct per question and sample."""
    return int(schema.value_hash(f"{seed}|{question_id}|{sample_index}")[:8], 16)
