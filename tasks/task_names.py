"""Task run names a person can read in the Prefect UI (Prefect's default is '<task>-<random suffix>'): what the
run works on, from its parameters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def named_by_runs(task: str) -> Callable[[], str]:
    """'calibrate · 3 run(s)', 'log · every stored result', 'ingest · traffic.csv': the task and what it covers."""

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
