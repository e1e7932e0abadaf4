"""MLflow logging on real tracking stores: a local SQLite store, and an `mlflow server` on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from cic.services import mlflow_tracking as tracking  # noqa: E402
from tests.support.mlflow_server import MlflowServer  # noqa: E402

pytestmark = pytest.mark.slow  # starts mlflow servers
GATES = '{"gates": [{"alpha": 0.1, "gate": {"kind": "cic.gate", "threshold": 0.5}}]}'


def _group(log_key: str = "k1", artifacts: tuple[Path, ...] = ()) -> tracking.GroupLog:
    table = tracking.GroupTable("per_alpha.json", {"alpha": [0.1, 0.2], "threshold": [0.01, "unattainable"],
                                                   "fdr_mean": [0.05, 0.1]}, {"gates.json": GATES})
    return tracking.GroupLog(experiment="cic-trivia_qa", run_name="smollm2 / semantic_entropy", log_key=log_key,
                             tags={"cic.model": "smollm2", "cic.dataset": "trivia_qa"},
                             params={"n_splits": 100, "alphas": [0.1, 0.2]}, metrics={"base_error_rate": 0.3},
                             artifacts=artifacts, table=table)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return MlflowClient()


def _runs(client: MlflowClient, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return list(client.search_runs([exp.experiment_id])) if exp else []


def test_group_is_logged_once_as_one_run_with_its_table(client: MlflowClient, tmp_path: Path) -> None:
    table = tmp_path / "table.md"
    table.write_text("| alpha | fdr |\n")
    parent_id, new = tracking.log_group(client, _group(artifacts=(table,)), artifact_location=str(tmp_path / "a"))
    assert new
    runs = _runs(client, "cic-trivia_qa")
    assert len(runs) == 1
    parent = client.get_run(parent_id)
    assert parent.data.params["n_splits"] == "100" and parent.data.metrics["base_error_rate"] == 0.3
    assert parent.data.tags[tracking.LOG_KEY_TAG] == "k1" and parent.info.status == "FINISHED"
    assert sorted(a.path for a in client.list_artifacts(parent_id)) == ["gates.json", "per_alpha.json", "table.md"]
    read = client.load_table(parent.info.experiment_id, "per_alpha.json", run_ids=[parent_id])
    assert read["alpha"].tolist() == [0.1, 0.2] and read["threshold"].tolist() == [0.01, "unattainable"]
    assert "per_alpha.json" in parent.data.tags["mlflow.loggedArtifacts"]  # MLflow's table view lists it

    again_id, new_again = tracking.log_group(client, _group(artifacts=(table,)))
    assert (again_id, new_again) == (parent_id, False)
    assert len(_runs(client, "cic-trivia_qa")) == 1


def test_a_partial_group_from_a_crash_is_replaced_not_duplicated(client: MlflowClient) -> None:
    exp_id = tracking.experiment_id(client, "cic-trivia_qa")
    stale = client.create_run(exp_id, tags={tracking.LOG_KEY_TAG: "k2"})
    client.create_run(exp_id, tags={tracking.PARENT_RUN_TAG: stale.info.run_id, tracking.PARENT_LOG_KEY_TAG: "k2"})
    parent_id, new = tracking.log_group(client, _group("k2"))
    assert new and parent_id != stale.info.run_id
    runs = _runs(client, "cic-trivia_qa")  # the stale run and its nested run (the layout before) are gone
    assert [r.info.run_id for r in runs] == [parent_id] and runs[0].info.status == "FINISHED"


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    server = MlflowServer(tmp_path).start()
    try:
        yield server.url
    finally:
        server.kill()


@pytest.mark.slow
def test_logging_to_a_real_mlflow_server(mlflow_server: str, tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=mlflow_server)
    table = tmp_path / "table.csv"
    table.write_text("alpha,fdr\n0.1,0.05\n")
    in_flight = tracking.requests_in_flight(mlflow_server)
    assert in_flight > 1 and tracking.requests_in_flight("sqlite:///x.db") == 1  # a server: requests overlap
    parent_id, new = tracking.log_group(client, _group("k3", artifacts=(table,)), in_flight=in_flight)
    assert new
    runs = _runs(client, "cic-trivia_qa")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted(a.path for a in client.list_artifacts(parent_id)) == ["gates.json", "per_alpha.json", "table.csv"]
    fetched = Path(client.download_artifacts(parent_id, "gates.json", str(tmp_path)))  # through the server's proxy
    assert fetched.read_text() == GATES
    assert tracking.log_group(client, _group("k3", artifacts=(table,)), in_flight=in_flight) == (parent_id, False)

    # params the server refuses (a name over MLflow's limit) while the table is in flight: the run ends
    # FAILED, and the next pass replaces the whole group instead of keeping a partial one
    broken = tracking.GroupLog(**{**_group("k4").__dict__, "params": {"x" * 300: 1}})
    with pytest.raises(mlflow.exceptions.MlflowException):
        tracking.log_group(client, broken, in_flight=in_flight)
    failed = [r for r in _runs(client, "cic-trivia_qa") if r.data.tags.get(tracking.LOG_KEY_TAG) == "k4"]
    assert [r.info.status for r in failed] == ["FAILED"]
    again, new = tracking.log_group(client, _group("k4"), in_flight=in_flight)
    assert new and again != failed[0].info.run_id
    assert sorted(r.data.tags.get(tracking.LOG_KEY_TAG) for r in _runs(client, "cic-trivia_qa")) == ["k3", "k4"]


@pytest.mark.faults
def test_group_names_cannot_write_outside_the_report_directory(tmp_path) -> None:
    """A model or dataset name with '../' or '/' stays inside report_dir (path traversal)."""
    from cic.reports.report import file_slug

    root = tmp_path / "reports"
    for parts in (("../../outside", "d", "e", "c", "k"), ("m", "/etc", "e", "c", "k"), ("..", "..", "..", "..", "..")):
        target = (root / file_slug(*parts)).resolve()
        assert target.parent == root.resolve(), parts


CONCURRENT = """
import sys, time
from pathlib import Path
from mlflow import MlflowClient
from tests.services.test_mlflow_tracking import _group
from cic.services import mlflow_tracking as tracking
client = MlflowClient(tracking_uri=sys.argv[1])
client.search_runs([client.get_experiment_by_name("cic-trivia_qa").experiment_id])  # warm: only the race is left
print("READY", flush=True)
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
run_id, new = tracking.log_group(client, _group("same"))
print("NEW" if new else "FOUND", run_id)
"""


@pytest.mark.faults
def test_two_processes_logging_one_group_at_once_log_it_once(tmp_path: Path) -> None:
    """Two loggers released at the same instant (two `cic run`s on one store, a `cic log` beside a run): one
    logs the group, the other waits for its claim and finds it — one FINISHED parent, nothing RUNNING."""
    import os
    import subprocess
    import sys
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment("cic-trivia_qa")  # the store set up before the race
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, uri, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    assert [p.stdout.readline().strip() for p in procs] == ["READY", "READY"]  # both wait at the line
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    said = sorted(out.split()[0] for out, _ in outputs)
    assert said == ["FOUND", "NEW"] and len({out.split()[1] for out, _ in outputs}) == 1, outputs
    client = MlflowClient(tracking_uri=uri)
    assert [r.info.status for r in _runs(client, "cic-trivia_qa")] == ["FINISHED"]  # the group's run, once


def test_an_experiment_created_by_another_logger_after_the_lookup_is_used_not_an_error(tmp_path: Path) -> None:
    """Two groups of a new dataset logged at once (`cic log`'s two groups in flight) both find no experiment and
    both create it: the one that loses the race uses the winner's experiment instead of failing the pass."""

    class Stale(MlflowClient):
        """A client whose first lookup ran before the other logger created the experiment."""

        looked = False

        def get_experiment_by_name(self, name: str):  # type: ignore[no-untyped-def]
            if not self.looked:
                self.looked = True
                return None
            return super().get_experiment_by_name(name)

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    winner = tracking.experiment_id(MlflowClient(tracking_uri=uri), "cic-trivia_qa")
    assert tracking.experiment_id(Stale(tracking_uri=uri), "cic-trivia_qa") == winner
    with pytest.raises(mlflow.exceptions.MlflowException):  # any other failure to create still fails loudly
        tracking.experiment_id(MlflowClient(tracking_uri=uri), "")
