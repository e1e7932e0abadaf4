"""No output path can destroy an input: every command that writes a file refuses the store, its own inputs and
a database or Parquet file cic did not write (unless --force), and writes through a renamed temporary file, so
a full disk leaves the previous file, or nothing, and one clear line."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.pipeline.gates.lifecycle import gates, retire
from cic.store import Store
from tests.pipeline.test_recalibration import make_live, only_group
from tests.support.pipeline_data import store_run
from tests.support.tables import make_table

pytestmark = pytest.mark.faults
runner = CliRunner()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(result: object, *words: str) -> None:
    text = " ".join(result.output.split())  # type: ignore[attr-defined]
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "Traceback" not in result.output  # type: ignore[attr-defined]
    for word in words:
        assert word in text, text


@pytest.fixture
def store_with_live_gate(tmp_path: Path) -> Path:
    db = tmp_path / "prod.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=datetime(2026, 1, 1, tzinfo=UTC), estimators=("semantic_entropy",))
        make_live(store, only_group(store))
    return db


@pytest.fixture
def table(tmp_path: Path) -> Path:
    scores, errors = make_table(np.random.default_rng(3), 600)
    path = tmp_path / "scores.parquet"
    pl.DataFrame({"score": scores, "error": errors}).write_parquet(path)
    return path


def test_gate_export_onto_the_store_is_refused_and_the_store_survives(store_with_live_gate: Path) -> None:
    db = store_with_live_gate
    before = digest(db)
    result = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(db)])
    one_line_error(result, "--out", "also an input")
    assert digest(db) == before
    with Store.open(db, read_only=True) as store:
        assert gates(store).filter(state="live").height == 1
    # even with --force: an input is never an output
    result = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(db), "--force"])
    one_line_error(result, "also an input")
    assert digest(db) == before


def test_calibrate_refuses_its_input_the_store_a_foreign_database_and_the_same_path_twice(
        table: Path, store_with_live_gate: Path, tmp_path: Path) -> None:
    db = store_with_live_gate
    base = ["calibrate", str(table), "--alpha", "0.2"]
    for args, words in (
            (["--gate", str(table)], ("--gate", "also an input")),
            (["--json", str(table)], ("--json", "also an input")),
            (["--gate", str(db)], ("--gate", "a DuckDB database that cic did not write")),
            (["--json", str(tmp_path / "x.json"), "--gate", str(tmp_path / "x.json")],
             ("--gate", "the same file as --json"))):
        before = {p: digest(p) for p in (table, db)}
        one_line_error(runner.invoke(app, base + args), *words)
        assert {p: digest(p) for p in (table, db)} == before
    stored_group = ["--model", "m", "--dataset", "d", "--estimator", "semantic_entropy", "--criterion",
                    "similarity[0.6]"]
    one_line_error(runner.invoke(app, ["calibrate", str(db), "--alpha", "0.3", *stored_group, "--gate", str(db)]),
                   "also an input")


def test_a_parquet_file_cic_did_not_write_needs_force_one_it_wrote_does_not(table: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.parquet"
    pl.DataFrame({"a": [1, 2]}).write_parquet(foreign)
    before = digest(foreign)
    args = ["evaluate", str(table), "--n-splits", "3", "--out"]
    one_line_error(runner.invoke(app, [*args, str(foreign)]), "a Parquet file that cic did not write", "--force")
    assert digest(foreign) == before
    assert runner.invoke(app, [*args, str(foreign), "--force"]).exit_code == 0
    assert pl.read_parquet(foreign).height == 10  # 5 alphas × 2 bounds
    # a file cic wrote is replaced on a rerun without --force
    assert runner.invoke(app, [*args, str(foreign)]).exit_code == 0
    assert not list(tmp_path.glob(".*.partial"))


def test_cic_export_onto_its_own_store_is_refused(store_with_live_gate: Path) -> None:
    db = store_with_live_gate
    renamed = db.with_suffix(".parquet")
    os.replace(db, renamed)  # a store whose name ends in .parquet is still the store
    before = digest(renamed)
    one_line_error(runner.invoke(app, ["export", "scores", str(renamed), "--db", str(renamed)]), "also an input")
    assert digest(renamed) == before


def test_retiring_the_last_live_gate_exports_an_explicit_serve_nothing_entry(store_with_live_gate: Path,
                                                                            tmp_path: Path) -> None:
    import json

    db, out = store_with_live_gate, tmp_path / "live.json"
    assert runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)]).exit_code == 0
    [entry] = json.loads(out.read_text())
    assert entry["serve"] == "gate" and entry["threshold"] is not None
    with Store.open(db) as store:
        retire(store, entry["gate_id"], reason="incident 42")
    result = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    [entry] = json.loads(out.read_text())
    assert entry["serve"] == "nothing" and entry["gate_id"] is None and entry["threshold"] is None
    assert "incident 42" in entry["reason"] and entry["model"] == "m"


def test_a_full_disk_leaves_the_previous_file_and_one_line(store_with_live_gate: Path, tmp_path: Path) -> None:
    """A real write failure: the command runs under a file-size limit (EFBIG, as a full disk gives ENOSPC)."""
    db, out = store_with_live_gate, tmp_path / "live.json"
    out.write_text('[{"serve": "nothing"}]\n')  # an earlier export: cic's to replace

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    cic = str(Path(sys.executable).with_name("cic"))
    proc = subprocess.run([cic, "gate", "export", "--db", str(db), "--out", str(out)], capture_output=True,
                          text=True, preexec_fn=small_files, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot be written" in proc.stderr and "previous file is unchanged" in proc.stderr
    assert out.read_text() == '[{"serve": "nothing"}]\n'
    assert not list(tmp_path.glob(".*.partial"))


def test_a_report_directory_that_is_an_existing_file_is_refused(table: Path, store_with_live_gate: Path) -> None:
    db = store_with_live_gate
    before = digest(db)
    one_line_error(runner.invoke(app, ["report", str(table), "--out", str(db), "--no-figures"]),
                   "--out", "is an existing file, not a directory")
    one_line_error(runner.invoke(app, ["validity", "--out", str(db), "--trials", "5"]), "is an existing file")
    one_line_error(runner.invoke(app, ["log", "--db", str(db), "--report-dir", str(db)]), "--report-dir",
                   "is an existing file")
    assert digest(db) == before


def test_devices_pipes_and_sockets_are_refused_as_outputs_and_stay_what_they_were(
        store_with_live_gate: Path, tmp_path: Path) -> None:
    """`--out /dev/full` as root replaced the device node with a JSON file; a named pipe hung the command."""
    import socket
    import stat

    db = store_with_live_gate
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        for target, kind in ((Path("/dev/null"), "a character device"), (fifo, "a named pipe"),
                             (sock_path, "a socket")):
            mode = os.stat(target).st_mode
            one_line_error(runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(target)]),
                           "--out", kind)
            assert os.stat(target).st_mode == mode  # still the device / pipe / socket
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    link = tmp_path / "to-pipe.json"
    link.symlink_to(fifo)  # a link to a pipe is a pipe
    one_line_error(runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(link)]), "a named pipe")


def test_an_output_through_a_symlink_replaces_the_target_the_serving_system_reads_and_keeps_the_link(
        store_with_live_gate: Path, tmp_path: Path) -> None:
    import json

    db = store_with_live_gate
    served = tmp_path / "serving" / "live-gates.json"
    served.parent.mkdir()
    served.write_text('[{"serve": "nothing"}]\n')  # last night's export
    link = tmp_path / "current.json"
    link.symlink_to(served)
    result = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(served)  # the link stays a link
    [entry] = json.loads(served.read_text())  # ... and what it names holds the new export
    assert entry["serve"] == "gate"
    assert not list(served.parent.glob(".*.partial")) and not list(tmp_path.glob(".*.partial"))
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "serving" / "new.json")
    assert runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(dangling)]).exit_code == 0
    assert dangling.is_symlink() and json.loads((tmp_path / "serving" / "new.json").read_text())[0]["serve"] == "gate"


def test_files_cic_did_not_write_need_force_csv_and_json_included(table: Path, store_with_live_gate: Path,
                                                                   tmp_path: Path) -> None:
    """`cic evaluate --out data.csv` overwrote a CSV cic did not write; `gate export` any JSON or text file."""
    data = tmp_path / "data.csv"
    data.write_text("customer,amount\nann,3\n")
    before = digest(data)
    args = ["evaluate", str(table), "--n-splits", "3", "--out", str(data)]
    one_line_error(runner.invoke(app, args), "--out", "a CSV file cic did not write", "customer", "--force")
    assert digest(data) == before
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert runner.invoke(app, args).exit_code == 0  # now it is cic's table: a rerun replaces it
    notes = tmp_path / "notes.json"
    for text in ('{"team": "serving"}\n', "plain text\n", '[{"threshold": 0.3}]\n'):
        notes.write_text(text)
        one_line_error(runner.invoke(app, ["gate", "export", "--db", str(store_with_live_gate), "--out",
                                           str(notes)]), "a file that cic did not write")
        assert notes.read_text() == text
    for flag in ("--json", "--gate"):
        notes.write_text('{"team": "serving"}\n')
        one_line_error(runner.invoke(app, ["calibrate", str(table), "--alpha", "0.2", flag, str(notes)]), flag,
                       "did not write")
    gate = tmp_path / "gate.json"
    for _ in range(2):  # cic's own gate file is replaced on a rerun
        assert runner.invoke(app, ["calibrate", str(table), "--alpha", "0.2", "--gate", str(gate)]).exit_code == 0


def test_report_directories_never_replace_their_input_or_files_cic_did_not_write(table: Path,
                                                                                 tmp_path: Path) -> None:
    """`cic report X/tables/results.csv --out X` overwrote its own input; `--out` replaced a foreign README.md."""
    out = tmp_path / "rep"
    fast = ["--model", "m", "--dataset", "d", "--estimator", "e", "--criterion", "c", "--n-splits", "2",
            "--no-figures", "--baselines", "", "--fractions", "0.5"]
    assert runner.invoke(app, ["report", str(table), "--out", str(out), *fast]).exit_code == 0
    own_table = next((out / "tables").glob("*.csv"))
    before = digest(own_table)
    one_line_error(runner.invoke(app, ["report", str(own_table), "--out", str(out), *fast]), "--out",
                   "holds an input of this command")
    assert digest(own_table) == before
    assert runner.invoke(app, ["report", str(table), "--out", str(out), *fast]).exit_code == 0  # cic's own dir
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "README.md").write_text("# Our team's notes\n")
    one_line_error(runner.invoke(app, ["report", str(table), "--out", str(foreign), *fast]), "--out",
                   "already holds files cic did not write", "README.md")
    assert (foreign / "README.md").read_text() == "# Our team's notes\n"
    one_line_error(runner.invoke(app, ["validity", "--out", str(foreign), "--trials", "5"]), "did not write")
    result = runner.invoke(app, ["report", str(table), "--out", str(foreign), *fast, "--force"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", [["report", "{table}", "--out", "{bad}", "--no-figures"],
                                     ["validity", "--out", "{bad}", "--trials", "10"],
                                     ["log", "{table}", "--report-dir", "{bad}", "--tracking-uri", "{uri}"]])
def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """A file where a parent directory should be: one line naming the option and why, exit 2, before any work."""
    (tmp_path / "afile").write_text("not a directory")
    table = Path(__file__).resolve().parents[2] / "infra" / "examples" / "scores_demo.csv"
    args = [a.format(table=table, bad=tmp_path / "afile" / "sub", uri=f"sqlite:///{tmp_path}/m.db")
            for a in command]
    result = runner.invoke(app, args)
    one_line_error(result, "the directory cannot be made (Not a directory")
    assert not (tmp_path / "m.db").exists()  # refused before MLflow was touched
