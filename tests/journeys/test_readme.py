"""The README's commands, run as printed: the installed `cic` in a fresh directory holding the repository's
`infra/` and `tests/` (the paths the README names), MLflow at its default (`sqlite:///mlflow.db` here). What a
command's output is quoted as in the README (a `# …` line under it) is what it prints; the `mlflow ui` command the
closing lines advise serves the α views they print. The production loop runs as printed in `test_journeys.py`;
`cic run` runs there and in `tests/cli/test_run_command.py` with a small config instead of the demo's."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.prefect_server import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.journey]

CIC = Path(sys.executable).parent / "cic"
ELSEWHERE = ("run", "The production loop")  # run by test_journeys.py


def readme_commands() -> list[tuple[list[str], str]]:
    """Every `.venv/bin/cic …` command of the README's bash blocks outside the production loop (continuation
    lines joined), with the output the README quotes under it ('' when none)."""
    text = (ROOT / "README.md").read_text()
    loop = text.split(f"## {ELSEWHERE[1]}\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands: list[tuple[list[str], str]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if block == loop:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith(".venv/bin/cic "):
                words = shlex.split(line, comments=True)[1:]
                if words[0] != ELSEWHERE[0]:
                    commands.append((words, ""))
            elif line.startswith("# ") and commands:
                commands[-1] = (commands[-1][0], (commands[-1][1] + " " + line[2:]).strip())
    return commands


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    for name in ("infra", "tests"):
        (root / name).symlink_to(ROOT / name)
    return root


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "COLUMNS": "100"}


def test_the_readme_names_the_commands_this_file_runs() -> None:
    assert [c[0] for c, _ in COMMANDS] == ["calibrate", "evaluate", "report", "log", "calibrate", "bench"]


@pytest.mark.parametrize(("command", "quoted"), COMMANDS, ids=[" ".join(c[:2]) for c, _ in COMMANDS])
def test_each_readme_command_runs_as_printed(command: list[str], quoted: str, here: Path) -> None:
    done = subprocess.run([str(CIC), *command], cwd=here, env=_env(), capture_output=True, text=True, timeout=900)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0 and "Traceback" not in said, said[-3000:]
    if quoted:  # the README's quote of it, up to its first parenthesis (the rest is wrapped by hand)
        assert quoted.split(" (")[0] in said, (quoted, said[:2000])
    if command[0] == "log":
        _the_printed_mlflow_ui_serves_the_printed_views(done.stdout, here)


def _the_printed_mlflow_ui_serves_the_printed_views(output: str, cwd: Path) -> None:
    """The closing lines' advice, run exactly as printed: `mlflow ui …` serves the store, and each experiment a
    printed view names holds the α view's tag."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 5000)) == 0:
            pytest.skip("port 5000 (mlflow ui's default) is taken on this machine")
    command = re.search(r"MLflow UI: `([^`]+)`, then (http://\S+)", output)
    views = re.findall(r"every model against α: (http://\S+#/experiments/(\d+)/runs\?\S+)", output)
    assert command and len(views) == 2, output
    server = subprocess.Popen(shlex.split(command[1]), cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{command[2]}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "mlflow ui did not answer"
                time.sleep(0.5)
        for url, experiment in views:
            assert url.startswith(command[2])
            got = json.load(urllib.request.urlopen(
                f"{command[2]}/api/2.0/mlflow/experiments/get?experiment_id={experiment}", timeout=10))
            tags = {t["key"]: t["value"] for t in got["experiment"]["tags"]}
            key = re.search(r"viewStateShareKey=([\w-]+)", url)[1]
            assert json.loads(tags[f"mlflow.sharedViewState.{key}"])["runsHiddenMode"] == "SHOW_ALL"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
