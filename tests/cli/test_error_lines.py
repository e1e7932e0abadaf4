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

pytestmark = pytest.mark.faults
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
