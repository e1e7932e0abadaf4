"""The one error type that means "the input is wrong": a command prints its message as one line and exits 2.

Anything else raised inside `cic` is a bug (or a service failing) and keeps its traceback and exit 1. It is a
`ValueError`, so library callers that catch ValueError for bad arguments keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input — a value, a file, a name, a state the user can change — named in one line."""
