"""Input checks shared by the statistics core: every error names the argument and the offending value."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cic.errors import UserError
from cic.registry import Registry

T = TypeVar("T")


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


def check_levels(values: Any, name: str) -> tuple[float, ...]:
    """A non-empty list of levels strictly inside (0, 1) (alphas), each named by its place in errors."""
    items = [values] if np.ndim(values) == 0 else list(values)
    if not items:
        raise UserError(f"{name} is empty: give at least one")
    return tuple(check_open_unit(a, f"{name}[{i}]") for i, a in enumerate(items))


@dataclass(frozen=True)
class Constraint:
    """A parameter's rule: what it says (for help and errors) and the check that returns the value to use."""

    name: str
    says: str
    check: Callable[[Any, str], Any]


#: Every constrained parameter of CIC's API and config, declared once: `checked` applies them to a function's
#: arguments by name, the config's fields validate through `constraint_of`.
PARAMETERS: Registry[Constraint] = Registry("parameter", (
    Constraint("alpha", "the target error rate, strictly between 0 and 1", check_open_unit),
    Constraint("alphas", "target error rates, each strictly between 0 and 1", check_levels),
    Constraint("delta", "the allowed failure probability, strictly between 0 and 1", check_open_unit),
    Constraint("confidence", "a confidence level strictly between 0 and 1", check_open_unit),
    Constraint("cal_fraction", "the calibration share of each split, strictly between 0 and 1", check_open_unit),
    Constraint("n_splits", "the number of random calibration/test splits, an integer >= 1", check_positive_int),
    Constraint("n_trials", "the number of simulated calibration sets, an integer >= 1", check_positive_int),
    Constraint("n_min", "the first accepted count tested, an integer >= 1", check_positive_int),
    Constraint("min_coverage", "the share of questions a gate must promise to answer, strictly between 0 and 1",
               check_open_unit),
    Constraint("grid", "thresholds fixed in advance: finite and strictly increasing", lambda v, n: as_grid(v, n)),
))


def constraint_of(name: str) -> Callable[[Any], Any]:
    """A validator of one declared parameter (for pydantic's `BeforeValidator`)."""
    rule = PARAMETERS.lookup(name)
    return lambda value: rule.check(value, name)


def checked(function: Callable[..., T]) -> Callable[..., T]:
    """Check every argument of `function` named like a declared parameter (`PARAMETERS`) before it runs, and pass
    the checked value on (None, where a parameter is optional, passes unchecked)."""
    signature = inspect.signature(function)
    names = [name for name in signature.parameters if name in PARAMETERS]

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> T:
        bound = signature.bind(*args, **kwargs)
        for name in names:
            value = bound.arguments.get(name)
            if value is not None:
                bound.arguments[name] = PARAMETERS[name].check(value, name)
        return function(*bound.args, **bound.kwargs)

    return run
