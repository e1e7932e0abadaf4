"""The services a command starts, held for exactly as long as it runs: `command_services` owns the processes
(Prefect's ephemeral server, a local Ray), sends the services' chatter to their log, and on the way out leaves them
in order — Ray left and Prefect's log and event queues flushed while their processes still answer, then the
processes stopped — so the command's exit code and wall time are its own.

Stopping the processes first is what a user saw: Ray's driver kept retrying its dead GCS and ended the process
with exit 1 sixty seconds after the last line, and Prefect's log worker drained into a closed port at exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cic.cli.service_logs import services_log_path, services_logged_to
from cic.services.processes import owned_processes

FLUSH_TIMEOUT_S = 5.0  # Prefect's own bound on a flush from a synchronous caller


def service_defaults() -> None:
    """Settings that make the services quiet and patient (unless already set); every command runs this before
    anything imports Prefect or MLflow, whose logging reads them once."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    # INFO reaches the flow run's log in the Prefect UI (stage progress, summaries); the console shows warnings only
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    # a tracking server that dies mid-run costs seconds, not MLflow's default minutes of backoff
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # MLflow prints two "View run / View experiment" lines per run against a server: hundreds per command
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def release_services() -> None:
    """Leave Ray and flush Prefect's queues to its API, each bounded; a no-op for a service never imported."""
    if "ray" in sys.modules:
        import ray

        with contextlib.suppress(Exception):
            if ray.is_initialized():
                ray.shutdown()
    if "prefect" in sys.modules:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogHandler

        with contextlib.suppress(Exception):
            APILogHandler.flush()  # every queued run-log line reaches the API (drain_all, 5 s at most)
        with contextlib.suppress(Exception):
            EventsWorker.drain_all(timeout=FLUSH_TIMEOUT_S)


@contextmanager
def command_services(db: str | Path, command: str = "run") -> Iterator[Path]:
    """Own the services a command on store `db` starts; yields the services' log file."""
    with owned_processes(db, command=command, before_stop=release_services), \
            services_logged_to(services_log_path(db)) as log:
        yield log
