"""Input checks shared by the statistics core: every error names the argument and the offending value."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from cic.errors import UserError


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def as_scores(values: Any, name: str = "scores") -> np.ndarray:
    """Return `values` as a 1-D float64 array of finite numbers, or raise naming the first bad entry."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{name} must be numeric; got {type(values).__name__}: {exc}") from None
    if arr.ndim != 1:
        raise UserError(f"{name} must be one-dimensional; got shape {arr.shape}")
    if arr.size == 0:
        raise UserError(f"{name} is empty: at least one value is needed")
    bad = ~np.isfinite(arr)
    if bad.any():
        i = _first_bad(bad)
        raise UserError(f"{name}[{i}] = {arr[i].item()!r}: scores must be finite (no NaN or ±inf)")
    return arr


def as_errors(values: Any, name: str = "errors") -> np.ndarray:
    """Return 0/1 error indicators as an int8 array; booleans and exact 0.0/1.0 floats are accepted."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise UserError(f"{name} must be one-dimensional; got shape {arr.shape}")
    if arr.size == 0:
        raise UserError(f"{name} is empty: at least one value is needed")
    if arr.dtype == bool:
        return arr.astype(np.int8)
    if not np.issubdtype(arr.dtype, np.number):
        values = arr.tolist()
        # the cell to name is the first that is not 0/1 in any spelling ("0" and "1" in a text column are fine,
        # only not as text): a "yes" at row 50 is reported at row 50, not at row 0
        looks_valid = {0, 1, "0", "1"}  # True == 1 and False == 0
        i = next((j for j, v in enumerate(values) if v not in looks_valid), None)
        if i is None:
            i = next(j for j, v in enumerate(values) if isinstance(v, str))
            raise UserError(f"{name}[{i}] = {values[i]!r}: errors are text, not numbers; store them as 0/1 "
                             "integers or booleans")
        raise UserError(f"{name}[{i}] = {values[i]!r}: errors must be 0/1 or booleans")
    bad = ~((arr == 0) | (arr == 1))
    if bad.any():
        i = _first_bad(bad)
        raise UserError(f"{name}[{i}] = {arr[i].item()!r}: errors must be 0/1 or booleans (1 = wrong answer)")
    return arr.astype(np.int8)


def as_pair(scores: Any, errors: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (scores, errors) pair of equal length."""
    s = as_scores(scores)
    e = as_errors(errors)
    if s.shape[0] != e.shape[0]:
        raise UserError(f"scores and errors differ in length: len(scores) = {s.shape[0]}, "
                         f"len(errors) = {e.shape[0]}")
    return s, e


def check_open_unit(value: Any, name: str) -> float:
    """A probability level strictly inside (0, 1), e.g. alpha, delta, cal_fraction."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} = {value!r}: must be a number in (0, 1)") from None
    if not (0.0 < v < 1.0):
        raise UserError(f"{name} = {value!r}: must lie strictly between 0 and 1")
    return v


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """An integer count of at least `minimum` (booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise UserError(f"{name} = {value!r}: must be an integer >= {minimum}")
    if value < minimum:
        raise UserError(f"{name} = {value!r}: must be an integer >= {minimum}")
    return int(value)


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """A name from a fixed set of choices."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise UserError(f"{name} = {value!r}: unknown; choose one of {', '.join(options)}")
    return value


def as_grid(values: Any, name: str = "grid") -> np.ndarray:
    """A non-empty, finite, strictly increasing 1-D threshold grid."""
    arr = as_scores(values, name)
    steps = np.diff(arr)
    if (steps <= 0).any():
        i = _first_bad(steps <= 0)
        raise UserError(f"{name} must be strictly increasing: {name}[{i}] = {arr[i].item()!r} is followed by "
                         f"{name}[{i + 1}] = {arr[i + 1].item()!r}")
    return arr


def parse_document(text: str, kind: str, what: str) -> dict[str, Any]:
    """Parse a CIC JSON document and check its `kind` tag, e.g. "cic.gate"."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} JSON is not valid JSON: {exc}") from None
    found = payload.get("kind") if isinstance(payload, dict) else None
    if found != kind:
        raise UserError(f"kind = {found!r}: not a {what} (expected {kind!r})")
    return payload
