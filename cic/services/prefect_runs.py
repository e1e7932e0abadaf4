"""How a run shows in Prefect: flow- and task-run names a person can read in the UI, and the logger a task writes
to (the run's log inside a run, a stdlib logger outside one)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def run_logger(fallback: str = "cic.pipeline") -> Any:
    """`prefect.get_run_logger()` when a run is active, else `logging.getLogger(fallback)` (a plain function call,
    a benchmark)."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(fallback)


def _config_label(config_path: Any) -> str:
    """The config's `name`, or its file name when it does not load (the flow then fails with the reason)."""
    from cic.pipeline.config import load_config

    try:
        return load_config(str(config_path)).name
    except (ValueError, OSError):
        return Path(str(config_path)).stem


def flow_run_name(kind: str | None = None) -> Callable[[], str]:
    """A `flow_run_name` callable: '<config name>[ · kind] · <UTC minute>' (`demo · 2026-11-24 09:00 UTC`,
    `demo · recalibrate · …`) instead of Prefect's random adjective-animal."""

    def name() -> str:
        from prefect.runtime import flow_run

        from cic.pipeline.config import DEMO_CONFIG

        parameters = flow_run.parameters or {}
        parsed = parameters.get("config")  # the config its command parsed, passed down (a deployment: the path)
        label = getattr(parsed, "name", None) or (parsed.get("name") if isinstance(parsed, dict) else None) \
            or _config_label(parameters.get("config_path", DEMO_CONFIG))
        return " · ".join([label, *([kind] if kind else []), f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"])

    return name


def named_by_runs(task: str) -> Callable[[], str]:
    """A `task_run_name` callable — 'calibrate · 3 run(s)', 'log · every stored result', 'ingest · traffic.csv':
    the task and what it covers, from its parameters (Prefect's default is '<task>-<random suffix>')."""

    def name() -> str:
        from prefect.runtime import task_run

        parameters = task_run.parameters or {}
        if parameters.get("path"):
            return f"{task} · {Path(str(parameters['path'])).name}"
        keys = parameters.get("run_keys")
        if keys is None:
            result = parameters.get("result")
            count = len(getattr(result, "candidates", []) or [])
            return f"{task} · {count} candidate(s)" if result is not None else f"{task} · every stored result"
        return f"{task} · {len(keys)} run(s)"

    return name
