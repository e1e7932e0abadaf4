"""The one contract every harness reader keeps: what it refuses, and how. A reader refuses — in one line naming the
file, the record and the field — an option log-likelihood or token log-probability that is not a log-probability
(non-finite, or above 0), a question recorded twice (two runs in one file: which to keep is not CIC's to guess), an
evaluation that did not finish, and a file it cannot parse; nothing else it reads becomes a traceback
(`guarded`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError

if TYPE_CHECKING:
    import polars as pl


def log_probabilities(values: Sequence[Any], where: str, field: str) -> list[float]:
    """The values as floats, each a log-probability (finite, at most 0), else one line naming the first that is
    not."""
    out = []
    for i, value in enumerate(values):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where}: {field}[{i}] = {value!r} is not a number") from None
        if not math.isfinite(number) or number > 0:
            raise UserError(f"{where}: {field}[{i}] = {value!r} is not a log-probability (finite, at most 0)")
        out.append(number)
    return out


class Once:
    """The records of one file by key: a key seen a second time is refused, naming where it was first."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[Hashable, str] = {}

    def add(self, key: Hashable, where: str) -> None:
        if key in self.seen:
            raise UserError(f"{where}: {self.what} {key!r} appears again (first at "
                            f"{self.seen[key].split(', ', 1)[-1]}); one record per question — two runs in one file? "
                            "keep one")
        self.seen[key] = where


def guarded(read: Callable[[Path], pl.DataFrame], label: str) -> Callable[[Path], pl.DataFrame]:
    """A reader that refuses what it cannot parse in one line naming the file (a malformed or truncated file, a
    field of another type than the harness writes, a path it cannot open), never a traceback."""

    def read_or_refuse(path: Path) -> pl.DataFrame:
        try:
            return read(path)
        except UserError:
            raise
        except OSError as exc:
            raise UserError(f"file = {str(path)!r}: cannot be read ({exc.strerror or exc})") from None
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError) as exc:
            detail = str(exc).splitlines()[0][:120] if str(exc) else ""
            raise UserError(f"file = {str(path)!r}: not well-formed {label} output ({type(exc).__name__}"
                            f"{': ' + detail if detail else ''})") from None
        except Exception as exc:  # a parser's own error type (polars, pyarrow): still the file, not CIC
            if type(exc).__module__.split(".")[0] not in ("polars", "pyarrow", "json"):
                raise
            raise UserError(f"file = {str(path)!r}: not well-formed {label} output ({type(exc).__name__})") from None

    return read_or_refuse
