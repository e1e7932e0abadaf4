"""No user-supplied string is read as rich markup or an emoji code: it is printed as typed, and never crashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cic.cli import app

TRICKY = ["a:b:c", "[red]x", "[/]", "%s%d", "x:smile:y", "[bold]]", "\x1b[31mred"]


@pytest.mark.faults
@pytest.mark.parametrize("value", TRICKY)
def test_bad_grid_values_come_back_verbatim(value: str, tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("score,error\n0.1,0\n0.2,1\n")
    result = CliRunner().invoke(app, ["calibrate", str(table), "--alpha", "0.2", "--search", "bonferroni",
                                      "--grid", value])
    assert result.exit_code == 2, result.output
    shown = result.output.replace("\n", "")
    assert f"--grid = {value!r}" in shown.replace("\x1b", "\\x1b") or repr(value) in shown


@pytest.mark.faults
@pytest.mark.parametrize("name", ["no[/]such.csv", "[red]x.csv", "x:b:.csv"])
def test_file_names_with_markup_are_printed_as_typed(name: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path / name), "--alpha", "0.2"])
    assert result.exit_code == 2
    assert name in result.output.replace("\n", "") and "Traceback" not in result.output


@pytest.mark.slow
@pytest.mark.faults
def test_newlines_and_tabs_in_names_from_an_ingest_file_are_printed_escaped(tmp_path: Path, prefect_api: str) -> None:
    """A model and a stream named in a user's file with a tab and a newline: `cic ingest`, `cic recalibrate` and
    `cic gate list` print them as \\t and \\n, so no line or table row is split."""
    import os
    import random
    import subprocess
    import sys
    from datetime import UTC, datetime, timedelta

    import polars as pl

    rng, n, start = random.Random(7), 300, datetime.now(UTC) - timedelta(days=7)
    scores = [rng.random() for _ in range(n)]
    pl.DataFrame({"model": "m\tx", "stream": "s\ny", "question_id": [f"q{i}" for i in range(n)],
                  "question": [f"question {i}" for i in range(n)], "answer": [f"answer {i}" for i in range(n)],
                  "timestamp": [start + timedelta(minutes=20 * i) for i in range(n)],
                  "score:predictive_entropy": scores,
                  "correct": [rng.random() >= 0.02 + 0.5 * s for s in scores]}).write_parquet(tmp_path / "t.parquet")
    env = {**os.environ, "PREFECT_API_URL": prefect_api}  # the session's server: no ephemeral one per command
    cic = str(Path(sys.executable).with_name("cic"))

    def run(*args: str) -> str:
        proc = subprocess.run([cic, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    ingested = run("ingest", "t.parquet", "--db", "s.duckdb")
    assert "(m\\tx/s\\ny)" in ingested and "\t" not in ingested and len(ingested.strip().splitlines()) == 1, ingested
    for shown in (run("recalibrate", "--db", "s.duckdb", "--no-mlflow", "--no-fail-on-alert"),
                  CliRunner().invoke(app, ["gate", "list", "--db", str(tmp_path / "s.duckdb")]).output):
        cells = "".join(shown.replace("│", "").split())  # a narrow table may wrap a cell: read the cells joined
        assert "m\\tx" in cells and "s\\ny" in cells and "\t" not in shown, shown
        assert not any(line.strip(" │").startswith("y") for line in shown.splitlines()), shown
