"""The pipeline flow in a child process that a test can SIGKILL when a chosen stage reports progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys
from cic.pipeline.run import progress
def show(stage, done, total):  # not print(): the flow's log_prints sends prints to Prefect's logger
    sys.stdout.write(f"PROGRESS|{stage}|{done}|{total}\\n")
    sys.stdout.flush()
progress.subscribe(show)
from flows.pipeline import pipeline
tracking = sys.argv[2] or None
summary = pipeline(config_path=sys.argv[1], tracking=tracking, log_to_mlflow=tracking is not None)
if summary.log_error:  # swallowed by the flow (the results are in DuckDB); a test must see it
    sys.stdout.write(f"LOG_ERROR|{summary.log_error}\\n")
sys.stdout.write("FINISHED\\n")
"""


def run_pipeline_process(config: Path, *, kill_at: tuple[str, int] | None = None, tracking: str | None = None,
                         timeout_s: float = 600, prefect_api: str | None = None,
                         meanwhile: tuple[str, int, Callable[[], None]] | None = None) -> tuple[int, list[str]]:
    """Run the flow on `config` in a new process group; with `kill_at=(stage prefix, n)`, SIGKILL the whole group
    as soon as that stage reports n units done; with `meanwhile=(stage prefix, n, action)`, run `action` here once
    when that stage reports n units done, while the flow goes on; with `prefect_api`, the flow reports to that
    server instead of starting an ephemeral one. Returns (exit code, the lines it printed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"PREFECT_API_URL": prefect_api} if prefect_api else {})}
    with (config.parent / "stderr.log").open("a") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(config), tracking or ""], cwd=ROOT, env=env,
                                text=True, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
        lines: list[str] = []
        deadline = time.time() + timeout_s
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            parts = line.strip().split("|")
            hit = (kill_at is not None and parts[0] == "PROGRESS" and parts[1].startswith(kill_at[0])
                   and int(parts[2]) >= kill_at[1])
            if (meanwhile is not None and parts[0] == "PROGRESS" and parts[1].startswith(meanwhile[0])
                    and int(parts[2]) >= meanwhile[1]):
                meanwhile[2]()
                meanwhile = None
            if hit or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=60)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # any Ray processes of the killed driver
    except ProcessLookupError:
        pass
    return proc.returncode, lines
