"""The README's commands as a person runs them: the installed `cic` as a subprocess in a fresh directory, against
a real `prefect server` and `mlflow server` started by the repo's own scripts. Each command must exit with the
code it promises, within seconds of its last line (no Ray or Prefect teardown hang), with a console a person can
read (no MLflow per-run URL lines, no tracebacks, a bounded number of lines)."""

from __future__ import annotations

import csv
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from tests.support.local_servers import free_port
from tests.support.pipeline_data import write_small_config
from tests.support.prefect_server import ROOT
from tests.support.processes import command_line

pytestmark = [pytest.mark.slow, pytest.mark.journey]

CIC = Path(sys.executable).parent / "cic"
EXIT_WITHIN_S = 10.0  # from the last line a command prints to the end of its process


@dataclass
class Journey:
    """One finished command: exit code, its lines with the time each was printed, and when it ended."""

    code: int
    lines: list[tuple[float, str]]
    stderr: str
    ended: float

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def exit_gap(self, prefix: str = "") -> float:
        """Seconds from the last line (starting with `prefix`) to the process's end."""
        times = [t for t, line in self.lines if line.startswith(prefix)]
        assert times, f"no line starts with {prefix!r}:\n{self.text}"
        return self.ended - times[-1]


def run_cic(args: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 600) -> Journey:
    """The installed console script, stdout read line by line as it is printed (not a terminal)."""
    proc = subprocess.Popen([str(CIC), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        lines.append((time.monotonic(), line.rstrip("\n")))
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    ended = time.monotonic()
    return Journey(proc.returncode, lines, proc.stderr.read(), ended)


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(1)
    pytest.fail(f"{url} did not answer: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh directory and the environment of a person whose team runs Prefect and MLflow servers, both started
    with `infra/scripts/start_*_server.sh`."""
    root = tmp_path_factory.mktemp("journey")
    prefect_port, mlflow_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    servers = []
    for script, env, url in (
            ("start_prefect_server.sh", {"CIC_PREFECT_PORT": str(prefect_port),
                                         "PREFECT_HOME": str(root / "prefect-server")},
             f"http://127.0.0.1:{prefect_port}/api/health"),
            ("start_mlflow_server.sh", {"CIC_MLFLOW_PORT": str(mlflow_port), "CIC_MLFLOW_DATA": str(root / "mlflow")},
             f"http://127.0.0.1:{mlflow_port}/health")):
        log = root / f"{script}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(["bash", str(ROOT / "infra" / "scripts" / script)], env={**base, **env},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        servers.append(proc)
        _wait(url, proc, log)
    # the MLflow script leaves MLflow's job runner off (CIC submits no GenAI job; its consumers cost CPU)
    assert not [command_line(p) for p in psutil.Process(servers[1].pid).children(recursive=True)
                if "huey" in command_line(p) or "_job_runner" in command_line(p)]
    user = root / "work"
    user.mkdir()
    env = {**base, "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
           "PREFECT_HOME": str(root / "prefect-client"), "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
           "CIC_CACHE_DIR": os.environ["CIC_CACHE_DIR"],
           "COLUMNS": "100"}
    write_small_config(user / "small.yaml", env["CIC_CACHE_DIR"])
    yield user, env
    for proc in servers:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def readable(journey: Journey, max_lines: int) -> None:
    """What every command owes a person: no traceback, no MLflow URL spam, a console of bounded size."""
    everything = journey.text + journey.stderr
    assert "Traceback" not in everything, everything[-3000:]
    assert "View run" not in everything and "View experiment" not in everything
    assert "Failed to connect to GCS" not in everything and "Error logging to API" not in everything
    assert len(journey.lines) <= max_lines, journey.text


@pytest.fixture(scope="module")
def ran(home: tuple[Path, dict[str, str]]) -> Journey:
    user, env = home
    return run_cic(["run", "--config", "small.yaml"], user, env, timeout_s=900)


def test_cic_run_exits_0_within_seconds_of_its_last_line_and_says_where_things_went(
        ran: Journey, home: tuple[Path, dict[str, str]]) -> None:
    user, _ = home
    assert ran.code == 0, ran.text[-3000:] + ran.stderr[-3000:]
    assert ran.exit_gap() <= EXIT_WITHIN_S and ran.exit_gap("log:") <= EXIT_WITHIN_S + 5, ran.exit_gap()
    readable(ran, max_lines=60)
    out = ran.text
    assert "smollm2 · trivia_qa · similarity[0.6] — split protocol of" in out.replace("\n", " ")
    assert "fallback" in out and "10/10" in out and "…" not in out  # fits 100 columns: nothing cut
    assert "answer smollm2: 6/6 (100.0%)" in out  # not a terminal: plain progress lines, not bars
    assert "Every α was unattainable" in out and "infra/examples/real/README.md" in out
    assert "group(s) logged" in out and (user / "small.duckdb").is_file() and any((user / "reports").iterdir())
    chatter = ("Started a local Ray instance",)
    assert not any(line in out + ran.stderr for line in chatter)  # the services' lines: in their log
    assert all(line in (user / "cic-services.log").read_text() for line in chatter)


def test_the_prefect_server_script_points_its_ui_at_its_own_port(home: tuple[Path, dict[str, str]]) -> None:
    """`infra/scripts/start_prefect_server.sh` on a port other than 4200 (the home's server): the UI it serves calls
    the API on that port, not the default one."""
    import json

    _, env = home
    api = env["PREFECT_API_URL"]
    with urllib.request.urlopen(f"{api.removesuffix('/api')}/ui-settings", timeout=10) as reply:
        assert json.loads(reply.read())["api_url"] == api


def test_cic_log_after_a_run_logs_nothing_twice_and_exits_at_once(ran: Journey,
                                                                 home: tuple[Path, dict[str, str]]) -> None:
    user, env = home
    logged = run_cic(["log", "--db", "small.duckdb"], user, env)
    assert logged.code == 0, logged.text + logged.stderr
    assert "0 group(s) logged" in logged.text and logged.exit_gap() <= EXIT_WITHIN_S
    readable(logged, max_lines=5)


def _traffic(user: Path, n: int = 400) -> None:
    """The README's production files: a week of a served model's traffic four weeks ago (`traffic.parquet`: a low
    score answers well, a high one badly) and its labels, come later (`labels.csv`): past the 14-day label window
    that records ingested without their label get."""
    import random

    import polars as pl

    rng = random.Random(7)
    start = datetime.now(UTC) - timedelta(days=28)
    scores = [rng.random() for _ in range(n)]
    ids = [f"q{i}" for i in range(n)]
    pl.DataFrame({"model": "smollm2", "stream": "web", "question_id": ids,
                  "question": [f"question {i}" for i in range(n)], "answer": [f"answer {i}" for i in range(n)],
                  "timestamp": [start + timedelta(minutes=20 * i) for i in range(n)],
                  # named as `cic ask` computes the score (the ingest warns about a bare `score:semantic_entropy`)
                  "score:semantic_entropy[embedding:0.9]": scores}).write_parquet(user / "traffic.parquet")
    pl.DataFrame({"model": "smollm2", "stream": "web", "question_id": ids,
                  "correct": [rng.random() >= 0.02 + 0.5 * s for s in scores]}).write_csv(user / "labels.csv")


def _readme_block(heading: str) -> list[list[str]]:
    """The `cic` commands of the README's bash block under `heading`, comments dropped, as argument lists."""
    text = (ROOT / "README.md").read_text().split(f"## {heading}\n", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True)[1:] for line in block.splitlines() if line.strip()]


def test_the_readme_production_loop_runs_as_printed(ran: Journey, home: tuple[Path, dict[str, str]]) -> None:
    """Every command of the README's production loop, as printed (with my.yaml a small config at α = 0.2 and the id the
    recalibration advised in place of the README's example id): each exits 0 within seconds of its last line, on
    a readable console, and the export serves the promoted gate; `cic ask` on the stream refuses before loading a
    model (it does not know the stream's prompt) and its advice runs as printed."""
    user, env = home
    _traffic(user)
    import yaml

    config = yaml.safe_load((user / "small.yaml").read_text())
    config["calibration"]["alphas"] = [0.2]  # what a week of this traffic certifies
    (user / "my.yaml").write_text(yaml.safe_dump(config))
    commands = _readme_block("The production loop")
    assert [c[:2] for c in commands] == [["ingest", "traffic.parquet"], ["ingest", "labels.csv"],
                                         ["recalibrate", "--config"], ["gate", "list"], ["gate", "promote"],
                                         ["gate", "export"]]
    said: dict[str, Journey] = {}
    for command in commands:
        if command[:2] == ["gate", "promote"]:  # the README's example id: the one the recalibration advised
            advised = [shlex.split(c) for c in re.findall(r"`(cic gate promote [^`]+)`", said["recalibrate"].text)]
            assert advised and advised[0][4:] == command[3:], said["recalibrate"].text  # same flags as the README
            command = advised[0][1:]
        done = run_cic(command, user, env)
        said[command[0]] = done
        assert done.code == 0, (command, done.text + done.stderr)
        assert done.exit_gap() <= EXIT_WITHIN_S, command
        readable(done, max_lines=40)
    assert "labelled" in said["ingest"].text
    import json

    served = [e for e in json.loads((user / "live-gates.json").read_text()) if e["serve"] == "gate"]
    assert [e["gate_id"][:12] for e in served] == [advised[0][3]]  # what the review promoted serves
    synced = run_cic(["gate", "sync", "--db", "prod.duckdb"], user, env)
    assert synced.code == 0 and "registered model(s)" in synced.text, synced.text + synced.stderr
    # `cic ask` on the stream: refused in one line before any model loads, pointing at the export, which runs
    asked = run_cic(["ask", "Who wrote Hamlet?", "--config", "my.yaml", "--db", "prod.duckdb", "--dataset", "web"],
                    user, env)
    assert asked.code == 2 and "loading" not in asked.stderr and len(asked.stderr.splitlines()) == 1, asked.stderr
    (advised_export,) = [shlex.split(c) for c in re.findall(r"`(cic [^`]+)`", asked.stderr)]
    assert advised_export[:3] == ["cic", "gate", "export"] and run_cic(advised_export[1:], user, env).code == 0


def test_cic_ask_answers_or_abstains_and_exits_at_once(ran: Journey, home: tuple[Path, dict[str, str]]) -> None:
    user, env = home
    asked = run_cic(["ask", "Who wrote Hamlet?", "--config", "small.yaml", "--alpha", "0.1"], user, env)
    assert asked.code == 0, asked.text + asked.stderr
    assert asked.text.startswith(("ANSWER", "ABSTAIN")) and asked.exit_gap() <= EXIT_WITHIN_S
    said = asked.stderr.splitlines()  # before a model loads (seconds): which gate serves and which model loads
    assert (said and said[0].startswith("gate ") and "loading smollm2" in said[0]) or "ABSTAIN" in asked.text, said
    if said and said[0].startswith("gate "):  # a model was asked: the score line says what it cost
        assert re.search(r"gate \w{12}, \d+ generation\(s\)\)", " ".join(asked.text.split())), asked.text
    readable(asked, max_lines=5)


def _week(path: Path, start: datetime, first_id: int, all_wrong: bool, n: int = 400) -> None:
    """400 records of a served model's labelled traffic from `start`, 20 minutes apart: a low score answers well,
    a high one badly — or every answer wrong (a drifted week)."""
    import random

    rng = random.Random(first_id)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["model", "stream", "question_id", "question", "answer", "timestamp",
                      "score:semantic_entropy", "correct"])
        for i in range(n):
            score = rng.random()
            correct = not all_wrong and rng.random() >= 0.02 + 0.5 * score
            out.writerow(["served", "web", f"q{first_id + i}", f"question {i}", f"answer {i}",
                          (start + timedelta(minutes=20 * i)).isoformat(), f"{score:.4f}", str(correct).lower()])


STATE_OF_NEWEST_RUN = """
import sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
from prefect.client.schemas.sorting import FlowRunSort
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["cic-recalibrate"])),
                                 sort=FlowRunSort.START_TIME_DESC, limit=200)
run = next(r for r in runs if r.parameters.get("config_path") == sys.argv[1])
print(run.state.type.value, run.state.message)
"""


def test_on_call_a_warning_completes_a_page_fails_and_the_rejected_gate_serves_nowhere(
        home: tuple[Path, dict[str, str]]) -> None:
    """The nightly job as on-call meets it: a first pass whose config lists an α this data never reaches exits 0
    with a warning (and auto-promotes the rest, never a `paper` gate); a week of wrong answers exits 1, the run's
    state message names the drift first, and the failing live gate is gone from the export and the registry in
    the same pass."""
    import json

    import yaml
    from mlflow import MlflowClient

    user, env = home
    config = yaml.safe_load((user / "small.yaml").read_text())
    config["calibration"] = {"alphas": [0.001, 0.2], "bounds": ["cp"], "searches": ["fallback", "paper"],
                             "n_splits": 10}
    config["recalibration"] = {"promotion": "auto"}
    config["storage"]["db"] = "oncall.duckdb"
    (user / "oncall.yaml").write_text(yaml.safe_dump(config))
    now = datetime.now(UTC)
    _week(user / "week1.csv", now - timedelta(days=14), 0, all_wrong=False)
    _week(user / "week2.csv", now - timedelta(days=6), 5000, all_wrong=True)
    recalibrate = ["recalibrate", "--config", "oncall.yaml"]

    assert run_cic(["ingest", "week1.csv", "--db", "oncall.duckdb"], user, env).code == 0
    first = run_cic(recalibrate, user, env)
    assert first.code == 0, first.text + first.stderr  # warnings only: the nightly job stays green
    assert "WARNING" in first.stderr and "alpha unattainable" in first.stderr and "PAGE" not in first.stderr
    readable(first, max_lines=40)
    assert run_cic(["gate", "export", "--db", "oncall.duckdb", "--out", "first.json"], user, env).code == 0
    served = [e for e in json.loads((user / "first.json").read_text()) if e["serve"] == "gate"]
    assert served and {e["search"] for e in served} == {"fallback"} and {e["alpha"] for e in served} == {0.2}
    live_id = served[0]["gate_id"]

    assert run_cic(["ingest", "week2.csv", "--db", "oncall.duckdb"], user, env).code == 0
    second = run_cic(recalibrate, user, env)
    assert second.code == 1, second.text + second.stderr
    readable(second, max_lines=40)
    assert "…" not in second.text  # 100 columns: thresholds and names whole, wrapped where needed
    first_alert = next(line for line in second.stderr.splitlines() if line.startswith(("PAGE", "WARNING")))
    assert first_alert.startswith("PAGE ") and "error rate at the live threshold" in first_alert.split(" — ")[0]
    assert f"WITHDRAWN live gate {live_id[:12]}" in second.stderr
    state = subprocess.run([sys.executable, "-c", STATE_OF_NEWEST_RUN, "oncall.yaml"], env=env, cwd=user,
                           capture_output=True, text=True, timeout=60)
    assert state.stdout.startswith("FAILED PAGE "), state.stdout + state.stderr  # what the notification carries
    assert "error rate at the live threshold" in state.stdout.split(" — ")[0]
    assert run_cic(["gate", "export", "--db", "oncall.duckdb", "--out", "second.json"], user, env).code == 0
    (entry,) = [e for e in json.loads((user / "second.json").read_text()) if e.get("flagged_gate_id") == live_id]
    assert entry["serve"] == "nothing" and "error rate at the live threshold" in entry["reason"]
    registry = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    versions = registry.search_model_versions(f"tags.`cic.gate_id` = '{live_id}'")
    assert len(versions) == 1 and versions[0].tags["cic.state"] == "withdrawn"
    model = registry.get_registered_model(versions[0].name)
    assert str(versions[0].version) not in {str(v) for v in (model.aliases or {}).values()}  # no alias serves it
    # what the page tells on-call to run: the withdrawn gate in the export's words, and what serves exactly
    listed = run_cic(["gate", "list", "--db", "oncall.duckdb", "--state", "live"], user, env)
    lines = listed.text.splitlines()
    assert listed.code == 0 and any(line.split()[:2] == [live_id[:12], "withdrawn"] for line in lines)
    why = " ".join(next(line for line in lines if line.startswith(f"{live_id[:12]} withdrawn since")).split())
    assert entry["restore"].rstrip("`") in why and "error rate at the live threshold" in why  # + the store
    serving = run_cic(["gate", "list", "--db", "oncall.duckdb", "--state", "serving"], user, env).text
    shown = {line.split()[0] for line in serving.splitlines() if line.split() and len(line.split()[0]) == 12
             and line.split()[0] != "gates"}
    exported = {e["gate_id"][:12] for e in json.loads((user / "second.json").read_text()) if e["serve"] == "gate"}
    assert shown == exported and live_id[:12] not in shown
    assert "serving now:" in second.text and second.text.rstrip().splitlines()[-1].startswith("  ")
    # the page's advice, run exactly as printed, succeeds (it names the store the nightly job read)
    withdrawn = next(line for line in second.stderr.splitlines() if line.startswith("WITHDRAWN"))
    advised = [shlex.split(c) for c in re.findall(r"`(cic [^`]+)`", withdrawn)]
    assert advised and all("--db" in c for c in advised), withdrawn
    followed = run_cic(advised[0][1:], user, env)
    assert followed.code == 0, (advised[0], followed.text + followed.stderr)


def _judged_week(path: Path, start: datetime, n: int = 1200) -> None:
    """`n` records from `start`, 5 minutes apart: a judge's verdict on every one (97% agreeing with the truth) and
    a person's on every third (an empty cell elsewhere)."""
    import random

    rng = random.Random(7)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["model", "stream", "question_id", "question", "answer", "timestamp",
                      "score:semantic_entropy", "correct:judge", "correct:human"])
        for i in range(n):
            score = rng.random()
            correct = rng.random() >= 0.02 + 0.4 * score
            judge = correct if rng.random() < 0.97 else not correct
            out.writerow(["judged", "web", f"j{i}", f"question {i}", f"answer {i}",
                          (start + timedelta(minutes=5 * i)).isoformat(), f"{score:.4f}", str(judge).lower(),
                          str(correct).lower() if i % 3 == 0 else ""])


def test_the_nightly_job_certifies_with_a_judge_and_people_and_says_so_where_on_call_reads(
        home: tuple[Path, dict[str, str]]) -> None:
    """`calibration.judged` in the nightly job's config: the installed `cic recalibrate` certifies the judge's
    labels corrected by the people's, serves that gate under criterion judge+human, and its label assumption is
    read back from the run's state message in Prefect, the serving lines, the export and the MLflow run's tags."""
    import json

    import yaml
    from mlflow import MlflowClient

    from cic.stats.calibration import JUDGED_ASSUMPTION

    user, env = home
    config = yaml.safe_load((user / "small.yaml").read_text())
    config["calibration"] = {"alphas": [0.2], "bounds": ["cp"], "searches": ["fallback"], "n_splits": 10,
                             "judged": [{"judge": "judge", "people": "human"}]}
    config["recalibration"] = {"promotion": "auto"}
    config["storage"]["db"] = "judged.duckdb"
    (user / "judged.yaml").write_text(yaml.safe_dump(config))
    _judged_week(user / "judged.csv", datetime.now(UTC) - timedelta(days=5))
    assert run_cic(["ingest", "judged.csv", "--db", "judged.duckdb"], user, env).code == 0
    done = run_cic(["recalibrate", "--config", "judged.yaml"], user, env)
    assert done.code == 0, done.text + done.stderr
    readable(done, max_lines=40)
    said = " ".join(done.text.split())
    assert "judge+human" in said and JUDGED_ASSUMPTION in said, done.text
    state = subprocess.run([sys.executable, "-c", STATE_OF_NEWEST_RUN, "judged.yaml"], env=env, cwd=user,
                           capture_output=True, text=True, timeout=60)
    assert state.stdout.startswith("COMPLETED ") and f"certified with a judge and people: {JUDGED_ASSUMPTION}" \
        in state.stdout, state.stdout + state.stderr
    assert run_cic(["gate", "export", "--db", "judged.duckdb", "--out", "judged.json"], user, env).code == 0
    (entry,) = [e for e in json.loads((user / "judged.json").read_text()) if e.get("criterion") == "judge+human"]
    assert entry["serve"] == "gate" and JUDGED_ASSUMPTION in entry["labels"], entry
    mlflow = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()],
                              filter_string="tags.`cic.criterion` = 'judge+human'")
    assert runs and all(JUDGED_ASSUMPTION in r.data.tags["cic.labels"] for r in runs)
    (version,) = mlflow.search_model_versions(f"tags.`cic.gate_id` = '{entry['gate_id']}'")
    assert version.tags["cic.state"] == "serving" and JUDGED_ASSUMPTION in version.tags["cic.labels"]
