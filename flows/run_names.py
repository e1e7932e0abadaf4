"""Names a person recognises in the Prefect UI: flow runs named from the config and the time
(`demo · 2026-11-24 09:00 UTC`, `demo · recalibrate · …`); task runs name their model or dataset in their own
task modules."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _config_label(config_path: Any) -> str:
    """The config's `name`, or its file name when it does not load (the flow then fails with the reason)."""
    from cic.pipeline.config import load_config

    try:
        return load_config(str(config_path)).name
    except (ValueError, OSError):
        return Path(str(config_path)).stem


def flow_run_name(kind: str | None = None) -> Callable[[], str]:
    """A `flow_run_name` callable: '<config name>[ · kind] · <UTC minute>'."""

    def name() -> str:
        from prefect.runtime import flow_run

        from flows.pipeline import DEMO_CONFIG

        label = _config_label((flow_run.parameters or {}).get("config_path", DEMO_CONFIG))
        return " · ".join([label, *([kind] if kind else []), f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"])

    return name

