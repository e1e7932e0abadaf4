"""The one error type that means "the input is wrong": a command prints its message as one line and exits 2.

Anything else raised inside `cic` is a bug (or a service failing) and keeps its traceback and exit 1. It is a
`ValueError`, so library callers that catch ValueError for bad arguments keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input — a value, a file, a name, a state the user can change — named in one line."""


class ServiceDown(UserError, ConnectionError):
    """A service the command needs (Prefect's API, MLflow, Ray) does not answer: an environment problem, not a
    bug — one line naming the service, its address and the fix, exit 2. A `ConnectionError` too, so retries that
    wait for a service treat it as one."""
