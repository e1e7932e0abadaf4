"""The logger a task writes to: Prefect's run logger inside a flow or task run (what the Prefect UI and a worker's
output show for that run), this module's stdlib logger outside one (a plain function call, a benchmark)."""

from __future__ import annotations

import logging
from typing import Any


def run_logger(fallback: str = "cic.pipeline") -> Any:
    """`prefect.get_run_logger()` when a run is active, else `logging.getLogger(fallback)`."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(fallback)
