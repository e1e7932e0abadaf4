"""Where the services' own chatter goes: while a command runs, Ray's and MLflow's loggers (cluster start-up,
token notices, database migrations) write to a log file beside the store, so the console shows cic's progress
and results; their errors still reach the console too."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVICE_LOGGERS = ("ray", "mlflow", "alembic")
LOG_NAME = "cic-services.log"


def services_log_path(db: str | Path) -> Path:
    """The log file of a store's commands: beside its DuckDB file."""
    return Path(db).expanduser().resolve().parent / LOG_NAME


@contextmanager
def services_logged_to(path: Path) -> Iterator[Path]:
    """Send the service loggers to `path` (appending) for the duration; errors also to stderr."""
    import mlflow  # noqa: F401 — importing them configures their loggers: replace those handlers afterwards
    import ray  # noqa: F401

    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.ERROR)
    saved = {}
    for name in SERVICE_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = logger.handlers[:]
        logger.handlers = [to_file, errors]
    try:
        yield path
    finally:
        for name, handlers in saved.items():
            logging.getLogger(name).handlers = handlers
        to_file.close()
