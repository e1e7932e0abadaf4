"""A real `prefect server start` on loopback: serve the recalibration deployment on a cron schedule, trigger it
on a quiet week (the run completes, candidates logged to MLflow) and on a drifted one (the run ends Failed)."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.run.stored_calibration import groups_of_run
from cic.store import Store
from tests.support.pipeline_data import store_run, write_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"

TRIGGER = """
import sys, time
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
name = "cic-recalibrate/recalibrate-nightly"
deadline = time.time() + 120
with get_client(sync_client=True) as client:  # the server is shared: wait for this test's own deployment
    while True:
        try:
            deployment = client.read_deployment_by_name(name)
            if deployment.parameters.get("config_path") == sys.argv[1]:
                break
        except Exception:
            if time.time() > deadline:
                raise
        if time.time() > deadline:
            raise TimeoutError(f"{name} never took this test's parameters")
        time.sleep(1)
print("CRON", deployment.schedules[0].schedule.cron)
run = run_deployment(name, timeout=300, poll_interval=1)  # the run ends in seconds: look every second
print("STATE", run.state.type.value, run.state.message)
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
with get_client(sync_client=True) as client:  # what on-call reads in the run's log (shipped shortly after)
    for _ in range(10):
        logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
        if run.state.type.value != "FAILED" or any("Finished in state" in m for m in logs):
            break
        time.sleep(1)
print("LOGS", repr(logs))
"""


def _trigger(server: dict[str, str], tmp_path: Path, config: Path) -> str:
    trigger = subprocess.run([sys.executable, "-c", TRIGGER, str(config)], env=server, cwd=ROOT,
                             capture_output=True, text=True, timeout=420)
    assert trigger.returncode == 0, trigger.stderr[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
    assert "CRON 0 3 * * *" in trigger.stdout
    return trigger.stdout


def test_served_recalibration_completes_on_a_quiet_week_and_fails_on_drift(server: dict[str, str],
                                                                          tmp_path: Path) -> None:
    from cic.pipeline.config import CalibrationConfig
    from tests.pipeline.test_recalibration import make_live

    db = tmp_path / "cic.duckdb"
    calibration = CalibrationConfig(alphas=(0.3,), bounds=("hoeffding", "cp"), searches=("fixed_sequence",),
                                    n_splits=10)
    with Store.open(db) as store:  # week 1 behind the live gates, then a quiet week 2
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
        run = store.read("runs").row(0, named=True)
        for group in groups_of_run(store, run):
            make_live(store, group, calibration)
        store_run(store, n=300, labelled_at=datetime(2026, 1, 8, tzinfo=UTC), id_offset=1000, seed=1)
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", alphas=[0.3])
    serve = (f"from flows.recalibrate import recalibrate_flow\n"
             f"recalibrate_flow.serve(name='recalibrate-nightly', cron='0 3 * * *', pause_on_shutdown=False, "
             f"parameters={{'config_path': {str(config)!r}}})\n")
    serve_log = (tmp_path / "serve.log").open("w")
    # the runner looks for scheduled runs every second (its default, 10 s, only makes the test wait)
    runner = subprocess.Popen([sys.executable, "-c", serve], env={**server, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
                              cwd=ROOT, stdout=serve_log, stderr=subprocess.STDOUT)
    try:
        quiet = _trigger(server, tmp_path, config)
        with Store.open(db) as store:  # week 3: scores moved and every answer is wrong
            store_run(store, n=300, labelled_at=datetime(2026, 1, 15, tzinfo=UTC), id_offset=2000, seed=2,
                      shift=0.5, base=1.0)
        drifted = _trigger(server, tmp_path, config)
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    assert "STATE COMPLETED" in quiet, quiet + (tmp_path / "serve.log").read_text()[-3000:]
    assert "STATE FAILED PAGE " in drifted, drifted + (tmp_path / "serve.log").read_text()[-3000:]
    assert "error rate at the live threshold" in drifted.split("STATE FAILED")[1].split(" — ")[0]  # drift first
    logs = drifted.split("LOGS", 1)[1]
    assert "'PAGE m/d " in logs  # the run log's first alert line is the headline
    assert "unexpected exception" not in logs and "Traceback" not in logs
    with Store.open(db) as store:
        recalibrated = gates(store, kind="recalibration")
    assert recalibrated.height == 2 * 2 * 2 and set(recalibrated["state"]) == {"candidate"}
    assert recalibrated.filter(pl.col("n_cal") == 600)["alerts"].list.len().min() > 0  # weeks 2+3: drift
    client = MlflowClient(tracking_uri=server["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("cic-t-d")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`cic.kind` = 'recalibration'")
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 4


def test_infra_prefect_yaml_deploys_and_a_process_worker_runs_a_deployment(server: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """`prefect deploy --prefect-file infra/prefect.yaml` as the README says, then the calibrate deployment run
    through a `cic-process` worker: the run completes and the gates are stored."""
    from cic.pipeline.gates.lifecycle import gates as stored_gates

    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store_run(store, n=200, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", alphas=[0.3])
    env = {**server, "CIC_HOME": str(ROOT)}

    def prefect(*args: str, timeout: float = 180) -> str:
        done = subprocess.run([str(PREFECT), "--no-prompt", *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    prefect("work-pool", "create", "cic-process", "--type", "process")
    deployed = prefect("deploy", "--prefect-file", "infra/prefect.yaml", "--all")
    for name in ("cic-pipeline/pipeline", "cic-recalibrate/recalibrate-nightly", "cic-calibrate/calibrate",
                 "cic-ingest/ingest"):
        assert name in deployed, deployed[-2000:]
    started = prefect("deployment", "run", "cic-calibrate/calibrate", "--param", f"config_path={config}",
                      "--param", f"db={db}")
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", started).group(1)
    worker = subprocess.run([str(PREFECT), "worker", "start", "--pool", "cic-process", "--run-once"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    state = subprocess.run([sys.executable, "-c", STATE_OF, run_id], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert "STATE COMPLETED" in state.stdout, (state.stdout, state.stderr[-2000:], worker.stdout[-3000:],
                                              worker.stderr[-3000:])
    with Store.open(db, read_only=True) as store:
        assert stored_gates(store).height == 2 * 2 * 1  # 2 estimators x alpha 0.3 x 2 bounds x paper


STATE_OF = """
import sys, time
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    deadline = time.time() + 90
    while True:
        run = client.read_flow_run(sys.argv[1])
        if run.state.is_final() or time.time() > deadline:
            break
        time.sleep(1)
print("STATE", run.state.type.value, run.state.message)
"""


CALIBRATE = """
import sys
from flows.calibrate import calibrate_flow
state = calibrate_flow(config_path=sys.argv[1], alphas=[float(sys.argv[2])], log_to_mlflow=False, return_state=True)
print("STATE", state.type.value, state.state_details.flow_run_id)
"""

TASK_SPANS = """
import sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
with get_client(sync_client=True) as client:  # the server is shared: read this run's task runs only
    for run_id in sys.argv[1:]:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        task = [t for t in runs if t.name.startswith("calib")][0]
        print("SPAN", task.start_time.timestamp(), task.end_time.timestamp())
"""


def test_flows_writing_one_store_queue_on_its_global_concurrency_limit(server: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """`prefect gcl create cic-store --limit 1`: two calibration flows of one store, started together in two
    processes, run one after the other (without the limit, the second would start and wait on the file lock).
    The limit is named after this test (`storage.concurrency_limit`): the flows of other tests on the shared
    server neither queue on it nor lose it while they hold a slot."""
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", n_splits=3000)  # seconds of work
    limit = f"cic-store-{tmp_path.name}"
    spec = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**spec, "storage": {**spec["storage"], "concurrency_limit": limit}}))
    created = subprocess.run([str(PREFECT), "--no-prompt", "gcl", "create", limit, "--limit", "1"], env=server,
                             capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr[-2000:]
    try:
        flows = [subprocess.Popen([sys.executable, "-c", CALIBRATE, str(config), alpha], env=server, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for alpha in ("0.3", "0.4")]
        outputs = [f.communicate(timeout=300) for f in flows]
    finally:  # the server is shared: later flows must not queue on this limit
        deleted = subprocess.run([str(PREFECT), "--no-prompt", "gcl", "delete", limit], env=server,
                                 capture_output=True, text=True, timeout=120)
    assert deleted.returncode == 0, deleted.stderr[-2000:]
    run_ids = []
    for out, err in outputs:
        line = next((x for x in out.splitlines() if x.startswith("STATE ")), "")
        assert line.startswith("STATE COMPLETED"), (out[-2000:], err[-3000:])
        run_ids.append(line.split()[-1])
    spans = subprocess.run([sys.executable, "-c", TASK_SPANS, *run_ids], env=server, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    (s1, e1), (s2, e2) = sorted(tuple(map(float, x.split()[1:])) for x in spans.stdout.splitlines()
                                if x.startswith("SPAN"))
    assert e1 <= s2, ((s1, e1), (s2, e2))  # the second calibration began after the first had ended
