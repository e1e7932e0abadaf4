"""`cic log` against a real tracking server that dies while it logs: one line saying how far it got and how to
finish (no traceback per thread), and the rerun, once the server is back, logs only what is missing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.faults, pytest.mark.slow]
CIC = str(Path(sys.executable).with_name("cic"))


def _long_table(path: Path, datasets: int = 6) -> Path:
    """(score, error) rows of one model on `datasets` datasets × two estimators: 12 groups to log."""
    rng = np.random.default_rng(0)
    parts = []
    for d in range(datasets):
        score = rng.random(300)
        error = rng.random(300) < 0.05 + 0.4 * score
        for k, estimator in enumerate(("predictive_entropy", "semantic_entropy")):
            parts.append(pl.DataFrame({"model": "m", "dataset": f"d{d:02d}", "estimator": estimator,
                                       "criterion": "exact_match", "score": score + 0.01 * k, "error": error,
                                       "question_id": [f"q{i}" for i in range(300)]}))
    pl.concat(parts).with_columns(pl.col("error").cast(pl.Int64)).write_parquet(path)
    return path


def _finished_runs(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM runs WHERE status = 'FINISHED'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_a_tracking_server_lost_mid_log_is_one_line_and_the_rerun_finishes(tmp_path: Path) -> None:
    table = _long_table(tmp_path / "scores.parquet")
    server = MlflowServer(tmp_path / "ml")
    (tmp_path / "ml").mkdir()
    server.start()
    command = [CIC, "log", str(table), "--tracking-uri", server.url, "--n-splits", "5"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while _finished_runs(tmp_path / "ml" / "server.db") < 1 and proc.poll() is None:
            assert time.monotonic() < deadline, "no group was logged within 300 s"
            time.sleep(0.05)
        server.kill()  # mid-log: the first group is in, the others are not
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("log:")]
    assert proc.returncode == 2, out[-1500:] + err[-1500:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert f"MLflow tracking server {server.url} stopped answering while results were logged: " in lines[0]
    assert "rerun `cic log` when it answers again" in lines[0]
    logged = _finished_runs(tmp_path / "ml" / "server.db")
    assert 1 <= logged < 12
    server.start()  # the same port and stores: the outage is over
    try:
        again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    finally:
        server.kill()
    assert again.returncode == 0, again.stdout[-1500:] + again.stderr[-1500:]
    import re

    found = re.search(r"(\d+) group\(s\) logged, (\d+) already in MLflow", " ".join(again.stdout.split()))
    assert found is not None, again.stdout
    assert int(found[2]) >= logged and int(found[1]) + int(found[2]) == 12  # only what was missing was sent
    assert _finished_runs(tmp_path / "ml" / "server.db") >= 12
