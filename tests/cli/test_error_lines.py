"""Bad input is one clear line and exit 2, checked before any service starts: absurd durations, repeated YAML
keys, a binary config, a missing store directory, a damaged store; names print with control characters
escaped."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cic.store import Store
from tests.pipeline.test_recalibration import make_live, only_group
from tests.support.pipeline_data import store_run

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # installed cic against dead services, full disks
CIC = str(Path(sys.executable).with_name("cic"))


def cic(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (no Prefect server may start: PREFECT_API_URL points nowhere)."""
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/m.db"}
    return subprocess.run([CIC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def one_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_an_absurd_duration_is_one_line(tmp_path: Path) -> None:
    one_line(cic("recalibrate", "--since", "1e9d", cwd=tmp_path), "since = '1e9d'", "longer than 100 years")
    (tmp_path / "x.csv").write_text("model,stream,question_id,correct\nm,d,q1,true\n")
    one_line(cic("ingest", "x.csv", "--max-skew", "1e400h", cwd=tmp_path), "--max-skew = '1e400h'")


def test_a_repeated_yaml_key_names_both_lines_and_a_binary_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "dup.yaml").write_text("name: a\ncalibration:\n  alphas: [0.1]\n  alphas: [0.2]\n")
    one_line(cic("run", "--config", "dup.yaml", cwd=tmp_path), "key 'calibration.alphas' appears twice, at lines 3 "
                                                               "and 4")
    (tmp_path / "bin.yaml").write_bytes(bytes(range(256)))
    one_line(cic("recalibrate", "--config", "bin.yaml", cwd=tmp_path), "config = 'bin.yaml'", "not a text file")


def test_a_missing_store_directory_and_a_damaged_store_are_refused_before_any_service(tmp_path: Path) -> None:
    one_line(cic("run", "--db", "no/such/dir/s.duckdb", cwd=tmp_path), "--db = 'no/such/dir/s.duckdb'",
             "does not exist")
    damaged = tmp_path / "s.duckdb"
    with Store.open(damaged) as store:
        store_run(store, n=50)
    data = bytearray(damaged.read_bytes())
    data[8192:8192 + 20000] = b"\xab" * len(data[8192:8192 + 20000])
    damaged.write_bytes(bytes(data))
    before = damaged.read_bytes()
    for args in (("recalibrate", "--db", "s.duckdb"), ("run", "--db", "s.duckdb"),
                 ("gate", "list", "--db", "s.duckdb"), ("ingest", "x.csv", "--db", "s.duckdb")):
        if args[0] == "ingest":
            (tmp_path / "x.csv").write_text("model,stream,question_id,correct\nm,d,q1,true\n")
        one_line(cic(*args, cwd=tmp_path), "is damaged", "Recover:")
    assert damaged.read_bytes() == before


def test_names_are_printed_with_control_characters_escaped(tmp_path: Path) -> None:
    from cic.cli import app

    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        store_run(store, model="evil\x1b[2J\rmodel", n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC),
                  estimators=("semantic_entropy",))
        make_live(store, only_group(store))
    result = CliRunner().invoke(app, ["gate", "list", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\r" not in result.output
    assert "evil\\x1" in result.output.replace("\n", "").replace("│", "").replace(" ", "")


RECORDS = ("model,stream,question_id,question,answer,timestamp,score:semantic_entropy,correct\n"
           "m,d,z1,q?,a,2026-11-01T09:00:00Z,0.1,true\nm,d,z2,q?,a,2026-11-01T09:00:00Z,0.2,false\n")


def test_damage_a_query_finds_after_open_is_one_line_naming_the_file_and_the_recovery(tmp_path: Path) -> None:
    from tests.store.test_store import damage_blocks_after_open

    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=datetime(2026, 1, 1, tzinfo=UTC), estimators=("semantic_entropy",))
        make_live(store, only_group(store))
    assert damage_blocks_after_open(db) > 0
    before = db.read_bytes()
    (tmp_path / "r.csv").write_text(RECORDS)
    for args in (("gate", "list", "--db", "s.duckdb"), ("gate", "export", "--out", "live.json", "--db", "s.duckdb"),
                 ("export", "scores", "scores.parquet", "--db", "s.duckdb"),
                 ("calibrate", "s.duckdb", "--model", "m", "--dataset", "d", "--estimator", "semantic_entropy",
                  "--criterion", "similarity[0.6]", "--alpha", "0.2"),
                 ("ingest", "r.csv", "--db", "s.duckdb"), ("gate", "sync", "--db", "s.duckdb")):
        proc = cic(*args, cwd=tmp_path)
        one_line(proc, "db = 's.duckdb' is damaged", "Corrupt database file", "Recover: restore the file from a copy",
                 "`cic export TABLE")
        assert "MLflow" not in proc.stderr, proc.stderr
    # recalibrate finds the damage inside its flow run: a real (ephemeral) Prefect server, still one line
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([CIC, "recalibrate", "--db", "s.duckdb"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    one_line(proc, "db = 's.duckdb' is damaged", "Recover:")
    assert db.read_bytes() == before
    assert not (tmp_path / "live.json").exists() and not (tmp_path / "scores.parquet").exists()


@pytest.mark.parametrize("room_kib", [0, 16_384])  # the insert fails / the checkpoint at commit fails (FATAL)
def test_a_full_disk_during_ingest_is_one_line_and_leaves_the_store_readable_and_unchanged(
        tmp_path: Path, room_kib: int) -> None:
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk or a quota while the store grows."""
    import resource

    import polars as pl

    from tests.store.test_store import every_table

    db = tmp_path / "s.duckdb"
    (tmp_path / "r.csv").write_text(RECORDS)
    assert cic("ingest", "r.csv", "--db", "s.duckdb", cwd=tmp_path).returncode == 0
    n, t0 = 200_000, datetime(2026, 11, 1, 9, tzinfo=UTC)
    pl.DataFrame({"model": "m", "stream": "d", "question_id": [f"b{i}" for i in range(n)],
                  "question": [f"question {i}?" for i in range(n)], "answer": [f"answer {i}" for i in range(n)],
                  "timestamp": t0, "score:semantic_entropy": [i / n for i in range(n)],
                  "correct": [i % 3 != 0 for i in range(n)]}).write_parquet(tmp_path / "big.parquet")
    before = every_table(db)
    limit = db.stat().st_size + room_kib * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    proc = subprocess.run([CIC, "ingest", "big.parquet", "--db", "s.duckdb"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, preexec_fn=small_files, timeout=300)
    one_line(proc, "db = 's.duckdb': ", "File too large", "free space")
    assert "earlier rows are intact" in proc.stderr or "the store is unchanged by it" in proc.stderr, proc.stderr
    assert every_table(db) == before  # readable, and holds exactly what it held
    assert cic("ingest", "big.parquet", "--db", "s.duckdb", cwd=tmp_path).returncode == 0  # room again: it resumes


BROKEN_CONFIG_LOADER = """
import sys
import cic.pipeline.config as config
from cic.errors import UserError

def broken(path):
    raise {kind}("load_config failed: {message}")

config.load_config = broken
from cic.cli import app
sys.argv = ["cic", "recalibrate", "--no-mlflow"]
app()
"""


@pytest.mark.parametrize("kind,code", [("UserError", 2), ("ValueError", 1), ("KeyError", 1)])
def test_only_a_user_error_is_one_line_and_exit_2_anything_else_keeps_its_traceback(kind: str, code: int,
                                                                                      tmp_path: Path) -> None:
    """A bug inside cic (a ValueError or KeyError that no input check raised) must not read as bad input."""
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", BROKEN_CONFIG_LOADER.format(kind=kind, message="the x invariant")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "the x invariant" in proc.stdout + proc.stderr
    if code == 2:
        one_line(proc, "error: load_config failed: the x invariant")
    else:
        assert "Traceback" in proc.stdout + proc.stderr and "broken" in proc.stdout + proc.stderr


def test_a_prefect_api_or_mlflow_server_that_does_not_answer_is_one_line_naming_it(tmp_path: Path) -> None:
    """A store and config that would run: `cic recalibrate` with PREFECT_API_URL at a dead port, `cic log` with
    MLflow's tracking server down — each one line naming the address and the fix, exit 2, within seconds."""
    import time

    from tests.support.pipeline_data import write_config

    with Store.open(tmp_path / "cic.duckdb") as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    write_config(tmp_path / "c.yaml", tmp_path / "cic.duckdb", tmp_path / "reports")
    started = time.monotonic()
    one_line(cic("recalibrate", "--config", "c.yaml", cwd=tmp_path), "PREFECT_API_URL = 'http://127.0.0.1:9/api'",
             "does not answer", "prefect server start")
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    down = subprocess.run([CIC, "log", "--db", "cic.duckdb"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    one_line(down, "MLflow tracking server http://127.0.0.1:9 does not answer", "MLFLOW_TRACKING_URI")
    assert time.monotonic() - started < 60
