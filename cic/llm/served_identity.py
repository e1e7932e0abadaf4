"""Which model a server really serves, and whether it honours `n`: read from what the server says about itself
(`GET /models`, `system_fingerprint`, the choices of an `n` request), never from the `model` field it echoes —
llama.cpp's server echoes whatever name a request gives, so that field cannot tell one model from another."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def listed_identity(body: Any, model: str, echoed: str) -> str | None:
    """The served model's identity from a `GET /models` reply: the entry named `model` (a server that routes by
    name), else the only entry when the server answered in the name the request gave (`echoed`: a one-model server
    that answers any name, as llama.cpp's does); with the weights it reads (`root`, as vLLM reports it) when they
    differ from the id. None when the listing cannot say — unreadable, empty, several models none of which is
    `model`, or one entry beside a server that names itself otherwise (`transformers serve` lists its download
    cache, not the model it was started with)."""
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    listed = [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str) and e["id"]]
    named = [e for e in listed if e["id"] == model]
    entry = named[0] if named else listed[0] if len(listed) == 1 and echoed == model else None
    if entry is None:
        return None
    root = entry.get("root")
    return f"{entry['id']} [{root}]" if isinstance(root, str) and root and root != entry["id"] else entry["id"]


def n_choices_problem(indices: Sequence[Any], texts: Sequence[str], n: int, *, distinct: bool) -> str | None:
    """Why a reply to a request for `n` completions is not n of them (None when it is): the count, the indices
    0..n-1, and — where `distinct` (a probe at temperature 1 that asks for random words) — at least two different
    texts, since a server that copies one completion n times would pass the other checks."""
    if len(indices) != n:
        return f"asked for n={n} completions, got {len(indices)}"
    if sorted(i if isinstance(i, int) else -1 for i in indices) != list(range(n)):
        return f"choice indices {list(indices)} are not 0..{n - 1}"
    if distinct and n > 1 and len(set(texts)) == 1:
        return f"all {n} completions are the same text"
    return None
