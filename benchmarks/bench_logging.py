"""Logging a store to a local MLflow server: the layout `cic log` uses against the one before it, in the same run,
each into a fresh server started by `infra/scripts/start_mlflow_server.sh` (as the README's users do).

    .venv/bin/python benchmarks/bench_logging.py [--db cic.duckdb]

Without `--db`, the demo store is made first (`cic run --no-mlflow` in a temporary directory, a few minutes).
The baseline is the layout before the per-α table: the same run per group plus one nested run per α × bound ×
search (four requests each, four in flight, one group at a time); the current path logs each group's per-α
results as one table (`cic.services.mlflow_layout`), two groups in flight. Prints both times and their ratio;
the demo's `cic run` against a server prints its own stage times ("stages: … log …").
"""

from __future__ import annotations

import argparse
import json
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

from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository  # noqa: E402

from cic.services import mlflow_results as results  # noqa: E402
from cic.services import mlflow_tracking as tracking  # noqa: E402
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


def nested_runs(client: object, artifact_uri: str, parent_id: str, table: tracking.GroupTable,
                group: tracking.GroupLog) -> None:
    """The layout before `per_alpha.json`: one nested run per table row (create, params and metrics, its gate
    as a text, finish: four requests each), REQUESTS_IN_FLIGHT rows at a time, as `cic log` sent them."""
    from concurrent.futures import ThreadPoolExecutor

    gates = json.loads(table.texts["gates.json"])["gates"]
    rows = [dict(zip(table.columns, values, strict=True)) for values in zip(*table.columns.values(), strict=True)]
    exp_id = client.get_run(parent_id).info.experiment_id  # type: ignore[attr-defined]

    def one(row: dict, gate: dict) -> None:
        sub = client.create_run(exp_id, run_name=f"{group.run_name} · {row['bound']} · {row['search']} · "  # type: ignore[attr-defined]
                                f"α={row['alpha']:g}", tags={**group.tags, tracking.PARENT_RUN_TAG: parent_id,
                                                             tracking.PARENT_LOG_KEY_TAG: group.log_key})
        numbers = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        client.log_batch(sub.info.run_id, metrics=tracking._metrics(numbers, 0),  # type: ignore[attr-defined]
                         params=tracking._params({k: row[k] for k in ("alpha", "bound", "search", "calibration_id")
                                                  if k in row}))
        with tempfile.TemporaryDirectory() as texts:
            (Path(texts) / "gate.json").write_text(json.dumps(gate["gate"]))
            get_artifact_repository(sub.info.artifact_uri, tracking_uri=url_of(client)).log_artifacts(texts)
        client.set_terminated(sub.info.run_id, "FINISHED")  # type: ignore[attr-defined]

    with ThreadPoolExecutor(tracking.REQUESTS_IN_FLIGHT) as pool:
        for sent in [pool.submit(one, row, gate) for row, gate in zip(rows, gates, strict=True)]:
            sent.result()


def url_of(client: object) -> str:
    return client.tracking_uri  # type: ignore[attr-defined]


def timed_log(db: Path, work: Path, name: str, *, baseline: bool) -> tuple[float, int]:
    """Seconds to log every group of `db` into a fresh server, and the groups logged."""
    proc, url = server(work / f"mlflow-{name}")
    real_table = tracking._log_table

    def table_then_nested(client: object, artifact_uri: str, run_id: str, table: tracking.GroupTable) -> None:
        real_table(client, artifact_uri, run_id, table)  # type: ignore[arg-type]
        nested_runs(client, artifact_uri, run_id, table, current_group[0])

    current_group: list[tracking.GroupLog] = []
    real_log_group = results.log_group

    def remember(client: object, group: tracking.GroupLog, **kwargs: object) -> tuple[str, bool]:
        current_group[:] = [group]
        return real_log_group(client, group, **kwargs)  # type: ignore[arg-type]

    patches = [mock.patch.object(tracking, "_log_table", table_then_nested),
               mock.patch.object(results, "GROUPS_IN_FLIGHT", 1),
               mock.patch.object(results, "log_group", remember)] if baseline else []
    try:
        for patch in patches:
            patch.start()
        start = time.perf_counter()
        stats = results.log_store(str(db), tracking=url, report_dir=str(work / f"reports-{name}"))
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
    print(f"{groups} group(s) to a fresh local mlflow server: with nested runs per alpha x bound x search "
          f"{before:.1f} s, with the per-alpha table {now:.1f} s ({before / now:.1f}x faster)")


if __name__ == "__main__":
    main()
