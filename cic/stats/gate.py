"""The serving artifact: a certified threshold that turns an uncertainty score into answer / abstain."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import numpy as np

from cic.errors import UserError
from cic.stats._validation import as_scores, parse_document

Decision = Literal["answer", "abstain"]


class Gate:
    """Answer when score <= threshold, abstain otherwise; a None threshold abstains on everything.

    Parameters
    ----------
    threshold : float or None
        The certified threshold (finite), or None when alpha was unattainable.
    metadata : dict, optional
        How the threshold was certified (alpha, delta, bound, ...), shown by a serving process; it never
        changes a decision.

    Examples
    --------
    >>> gate = Gate(0.4)
    >>> gate.decide(0.39), gate.decide(0.41), Gate(None).decide(0.0)
    ('answer', 'abstain', 'abstain')
    >>> Gate.from_json(gate.to_json()).threshold
    0.4
    """

    __slots__ = ("_threshold", "_metadata")

    def __init__(self, threshold: float | None, metadata: dict[str, Any] | None = None) -> None:
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.number):
                raise UserError(f"threshold = {threshold!r}: must be a finite number or None")
            threshold = float(threshold)
            if not math.isfinite(threshold):
                raise UserError(f"threshold = {threshold!r}: must be a finite number or None")
        self._threshold = threshold
        self._metadata = dict(metadata or {})

    @property
    def threshold(self) -> float | None:
        return self._threshold

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def accept(self, scores: Any) -> np.ndarray:
        """Boolean array: True where the answer is returned (score <= threshold)."""
        arr = as_scores(np.atleast_1d(np.asarray(scores, dtype=np.float64)), "scores")
        if self._threshold is None:
            return np.zeros(arr.shape, dtype=bool)
        return arr <= self._threshold

    def decide(self, score: float) -> Decision:
        """"answer" or "abstain" for one score."""
        return "answer" if bool(self.accept([score])[0]) else "abstain"

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({"kind": "cic.gate", "version": 1, "threshold": self._threshold,
                           "metadata": self._metadata}, indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Gate:
        """Load a gate written by to_json; anything else is refused with a clear error."""
        payload = parse_document(text, "cic.gate", "CIC gate")
        if "threshold" not in payload:
            raise UserError("gate JSON lacks the field 'threshold'")
        return cls(payload["threshold"], payload.get("metadata") or {})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gate) and (self._threshold, self._metadata) == (other._threshold, other._metadata)

    def __hash__(self) -> int:
        return hash(self._threshold)

    def __repr__(self) -> str:
        return f"Gate(threshold={self._threshold!r})"
