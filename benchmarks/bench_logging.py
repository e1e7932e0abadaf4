"""Logging a store to a local MLflow server: the requests as `cic log` sends them against one at a time, in the
same run, each into a fresh server started by `infra/scripts/start_mlflow_server.sh` (as the README's users do).

    .venv/bin/python benchmarks/bench_logging.py [--db cic.duckdb]

Without `--db`, the demo store is made first (`cic run --no-mlflow` in a temporary directory, a few minutes).
The baseline sends one request at a time and looks each nested run up before writing its text (what `cic log`
did before); the current path keeps two groups and four requests per group in flight and writes texts straight
to the run's artifact location. Prints both times and their ratio; the demo's `cic run` against a server prints
its own stage times ("stages: … log …").
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cic.services import mlflow_tracking as tracking  # noqa: E402
from tasks import log as log_task  # noqa: E402
from tests.support.mlflow_server import free_port  # noqa: E402


def demo_store(work: Path) -> Path:
    """The demo config's store, made with `cic run --no-mlflow`."""
    subprocess.run([str(ROOT / ".venv" / "bin" / "cic"), "run", "--no-mlflow"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)
    return work / "cic.duckdb"


def server(data: Path) -> tuple[subprocess.Popen, str]:
    """A fresh `mlflow server` from the repo's start script; returns the process and its URL."""
    port = free_port()
    proc = subprocess.Popen(["bash", str(ROOT / "infra" / "scripts" / "start_mlflow_server.sh")],
                            env={**os.environ, "CIC_MLFLOW_PORT": str(port), "CIC_MLFLOW_DATA": str(data)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("mlflow server did not start within 120 s")


def one_at_a_time(client: object, exp_id: str, parent_id: str, group: tracking.GroupLog,
                  child: tracking.ChildRun, now: int) -> None:
    """The nested run as logged before: its text through `client.log_text`, which looks the run up first."""
    sub = client.create_run(exp_id, run_name=child.name, tags={  # type: ignore[attr-defined]
        **group.tags, **child.tags, tracking.PARENT_RUN_TAG: parent_id, tracking.PARENT_LOG_KEY_TAG: group.log_key})
    client.log_batch(sub.info.run_id, metrics=tracking._metrics(child.metrics, now),  # type: ignore[attr-defined]
                     params=tracking._params(child.params))
    for name, text in child.texts.items():
        client.log_text(sub.info.run_id, text, name)  # type: ignore[attr-defined]
    client.set_terminated(sub.info.run_id, "FINISHED")  # type: ignore[attr-defined]


def timed_log(db: Path, work: Path, name: str, *, baseline: bool) -> tuple[float, int]:
    """Seconds to log every group of `db` into a fresh server, and the groups logged."""
    proc, url = server(work / f"mlflow-{name}")
    patches = [mock.patch.object(tracking, "REQUESTS_IN_FLIGHT", 1), mock.patch.object(log_task, "GROUPS_IN_FLIGHT", 1),
               mock.patch.object(tracking, "_log_child", one_at_a_time)] if baseline else []
    try:
        for patch in patches:
            patch.start()
        start = time.perf_counter()
        stats = log_task.log_results.fn(str(db), tracking=url, report_dir=str(work / f"reports-{name}"))
        return time.perf_counter() - start, stats.logged
    finally:
        for patch in patches:
            patch.stop()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="a store with pipeline runs (default: the demo's, made first)")
    args = parser.parse_args()
    if args.db is not None and not args.db.is_file():
        parser.error(f"--db = {str(args.db)!r}: no such file")
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # as every cic command sets it
    with tempfile.TemporaryDirectory(prefix="cic-bench-logging-") as tmp:
        work = Path(tmp)
        db = args.db.resolve() if args.db else demo_store(work)
        before, groups = timed_log(db, work, "baseline", baseline=True)
        now, again = timed_log(db, work, "current", baseline=False)
    assert groups == again > 0, (groups, again)
    print(f"{groups} group(s) to a fresh local mlflow server: one request at a time {before:.1f} s, "
          f"cic log {now:.1f} s ({before / now:.1f}x faster)")


if __name__ == "__main__":
    main()
