"""What a run's one engine probe found: the identity that keys the run, and the engine's state workers adopt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineProbe:
    """What a run's one probe found (picklable: it crosses into Ray actors): the identity that keys the run (None
    where the spec itself does, as for local weights) and the engine's own state (None: probe again, and refuse
    an identity other than `identity` — how `cic ask` checks the model a gate was certified on)."""

    identity: str | None
    state: dict[str, Any] | None = field(default=None, compare=False)
