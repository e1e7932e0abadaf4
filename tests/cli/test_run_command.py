"""`cic run` as a user runs it: the installed command in a subprocess, on a small config, in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pipeline_data import write_small_config
from tests.support.processes import command_line, still_running

pytestmark = pytest.mark.slow

CIC = Path(sys.executable).parent / "cic"


def _small_config(tmp_path: Path) -> Path:
    return write_small_config(tmp_path / "small.yaml", os.environ["CIC_CACHE_DIR"])


def test_cic_run_prints_the_table_says_where_things_went_and_why_nothing_certified(tmp_path: Path) -> None:
    """Two models, their cascade and each one's estimator chosen, as the closing tables show them."""
    config = write_small_config(tmp_path / "small.yaml", os.environ["CIC_CACHE_DIR"], pair=True)
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_LEVEL"},  # Prefect's INFO, as users run
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "COLUMNS": "100"}
    proc = subprocess.run([str(CIC), "run", "--config", str(config)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "smollm2 · trivia_qa · similarity[0.6] — split protocol of" in out.replace("\n", " ")
    assert "fallback" in out and "10/10" in out and "…" not in out  # fits 100 columns: nothing cut
    assert f"DuckDB: {tmp_path / 'small.duckdb'}" in out.replace("\n", "") or "DuckDB: small.duckdb" in out
    assert (tmp_path / "small.duckdb").is_file() and (tmp_path / "mlflow.db").is_file()
    assert any((tmp_path / "reports").iterdir())
    assert "group(s) logged" in out
    assert "answer smollm2: 6/6 (100.0%)" in out  # not a terminal: plain progress lines, not bars
    flat = " ".join(out.split())
    assert "small-pair · trivia_qa · similarity[0.6] — cascade smollm2 -> smollm2-bf16: one guarantee for the " \
           "system" in flat
    assert "smollm2:auto · trivia_qa · similarity[0.6] — estimator chosen (δ/K each)" in flat
    assert "smollm2-bf16:auto · trivia_qa" in flat
    assert flat.count("certifies nothing") == 6  # six questions: no system certifies either, said in each cell
    assert "7 group(s) logged" in flat  # 4 single-model groups, the cascade and both estimator choices
    # six questions cannot certify alpha = 0.1: the closing lines say why and where a real result is
    assert "Every α was unattainable" in out and "infra/examples/real/README.md" in out
    assert not (tmp_path / "mlruns").exists()  # artifacts beside the SQLite file, not in the working directory
    chatter = ("Started a local Ray instance", "Creating initial MLflow database tables")
    assert not any(line in proc.stdout + proc.stderr for line in chatter)  # the services' lines: in their log
    services = (tmp_path / "cic-services.log").read_text()
    assert all(line in services for line in chatter) and "cic-services.log" in out


@pytest.mark.faults
def test_after_a_sigkill_nothing_cic_run_started_outlives_it_and_the_store_reads(tmp_path: Path) -> None:
    """The watchdog stops Prefect's server, Ray and the rest within seconds of a SIGKILL, and the store the run
    was writing opens. (That a rerun then completes with exactly an uninterrupted run's tables and MLflow runs,
    after a kill at every stage, is tests/flows/test_pipeline_e2e.py.)"""
    import signal

    import psutil

    config = _small_config(tmp_path)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "CIC_CACHE_DIR": str(tmp_path)}
    first = subprocess.Popen([str(CIC), "run", "--config", str(config), "--no-mlflow"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 600
    for line in first.stdout:  # wait until Prefect's server and Ray are up and answering has begun
        if line.startswith("answer smollm2:") or time.time() > deadline:
            break
    time.sleep(1)  # the watchdog's next look
    tree = psutil.Process(first.pid).children(recursive=True)
    assert len(tree) >= 3, [p.name() for p in tree]  # Prefect's server, Ray's processes, the watchdog
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    alive = tree
    deadline = time.time() + 20
    while alive and time.time() < deadline:  # the watchdog stops them: no later command is needed
        alive = still_running(tree)
        time.sleep(0.2)
    assert alive == [], [command_line(p)[:120] for p in alive]
    listed = subprocess.run([str(CIC), "gate", "list", "--db", str(next(tmp_path.glob("*.duckdb")))], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]  # no lock, no damage left
