"""Advice that works when followed: a withdrawal's restore advice names the flag its candidate needs and why, and
every `cic gate …` command a console prints names the store the printing command read (run as printed)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cic.cli import app
from cic.cli.common import console, friendly_errors, on_store, styled
from cic.errors import UserError
from cic.pipeline.gates.asking import serving_gate
from cic.pipeline.gates.lifecycle import retire
from cic.pipeline.gates.serving_state import restore_advice
from cic.store import Store
from tests.pipeline.test_gates import ASK, two_weeks

LIVE, READY = "a" * 12 + "live", "b" * 12 + "ready"


def _commands(text: str) -> list[list[str]]:
    return [shlex.split(c) for c in re.findall(r"`(cic [^`]+)`", text)]


def test_a_candidate_with_alerts_is_advised_with_the_flag_promote_needs_and_its_alerts_named() -> None:
    advice = restore_advice(LIVE, anytime=False, ready=READY, ready_alerts=["live gate aaaa: error rate 40/100"],
                            db="/srv/my store.duckdb")
    assert _commands(advice) == [
        ["cic", "gate", "promote", READY[:12], "--db", "/srv/my store.duckdb", "--despite-alerts"],
        ["cic", "gate", "confirm", LIVE[:12], "--db", "/srv/my store.duckdb"]]
    assert "error rate 40/100" in advice  # why the flag is needed, in the advice itself
    quiet = restore_advice(LIVE, anytime=False, ready=READY)
    assert _commands(quiet) == [["cic", "gate", "promote", READY[:12]], ["cic", "gate", "confirm", LIVE[:12]]]


def test_printed_gate_commands_name_the_store_that_was_read_unless_it_is_the_default() -> None:
    stored = f"promote a newer gate of its key, or after review `cic gate confirm {LIVE[:12]}`"
    assert on_store(stored, "cic.duckdb") == stored
    assert _commands(on_store(stored, "night/g.duckdb")) == [["cic", "gate", "confirm", LIVE[:12], "--db",
                                                               "night/g.duckdb"]]
    flagged = f"`cic gate promote {READY[:12]} --despite-alerts`"
    assert _commands(on_store(flagged, "a b.duckdb")) == [["cic", "gate", "promote", READY[:12], "--db", "a b.duckdb",
                                                           "--despite-alerts"]]
    named = f"`cic gate promote {READY[:12]} --db x.duckdb`"
    assert on_store(named, "y.duckdb") == named  # a command that names its store keeps it


def _run_as_printed(command: list[str], cwd: Path) -> Any:
    """`cic …` exactly as a message printed it, from the directory the message was printed in."""
    here = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, command[1:] + (["--no-mlflow"] if command[2] == "promote" else []))
    finally:
        os.chdir(here)


def test_a_key_without_a_live_gate_names_its_newest_candidate_and_the_commands_run_as_printed(
        tmp_path: Path) -> None:
    """`cic ask` on a key whose live gate was retired: the refusal lists the candidates waiting and the commands
    that list and promote the newest, naming the store it read; run as printed, both succeed and the key serves."""
    db = tmp_path / "night" / "g.duckdb"
    db.parent.mkdir()
    live, candidate = two_weeks(db)
    with Store.open(db) as store:
        retire(store, live, reason="test")
    with pytest.raises(UserError) as refused:
        serving_gate(str(db), **ASK)
    said = str(refused.value)
    assert candidate[:12] in said and live[:12] not in said
    commands = _commands(said)
    assert [c[:3] for c in commands] == [["cic", "gate", "list"], ["cic", "gate", "promote"]], said
    assert all(c[c.index("--db") + 1] == str(db) for c in commands)
    for command in commands:
        done = _run_as_printed(command, tmp_path)
        assert done.exit_code == 0, (command, done.output)
    assert serving_gate(str(db), **ASK).calibration_id == candidate


@friendly_errors
def _command_on(db: str) -> None:
    """A command as `cic` wraps them: advice printed on stdout, then a refusal."""
    console.print(styled(("WITHDRAWN", "bold red"), f" to restore: `cic gate confirm {LIVE[:12]}` after review"))
    raise UserError(f"promote it after review: `cic gate promote {READY[:12]} --despite-alerts`; see `cic gate list`")


@pytest.mark.parametrize("db", ["night/a b.duckdb", "cic.duckdb"])
def test_every_message_names_the_store_the_command_read_in_its_gate_commands(
        db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What a command prints — styled or not, stdout or the error line — names its --db in each `cic gate …`
    command, unless that is the default store here; the next command starts from no store."""
    with pytest.raises(typer.Exit):
        _command_on(db=db)
    printed = capsys.readouterr()
    where = [] if db == "cic.duckdb" else ["--db", db]
    assert _commands(" ".join(printed.out.split())) == [["cic", "gate", "confirm", LIVE[:12], *where]]
    assert _commands(" ".join(printed.err.split())) == [["cic", "gate", "promote", READY[:12], *where,
                                                         "--despite-alerts"], ["cic", "gate", "list", *where]]
    console.print(f"`cic gate confirm {LIVE[:12]}`")
    assert _commands(capsys.readouterr().out) == [["cic", "gate", "confirm", LIVE[:12]]]


def test_the_closing_review_line_promotes_a_quiet_candidate_of_the_default_key_else_says_why_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    """After a recalibration: the line names a candidate id to promote — one without alerts, of the bound and
    search `cic ask` asks by default, when there is one; one that carries alerts comes with --despite-alerts and
    its alerts. (The journey tier runs it as printed.)"""
    from types import SimpleNamespace

    from cic.cli.pipeline import print_recalibration_notes
    from cic.pipeline.run.run_results import CandidateRow, GroupPlace
    from cic.stats.searches import DEFAULT_SEARCH

    def candidate(gate_id: str, search: str, alerts: list[str]) -> CandidateRow:
        return CandidateRow(GroupPlace("m", "d", "semantic_entropy", "human", 0.1, "cp", search), gate_id,
                            "candidate", 0.3, 400, None, alerts)

    def closing(*candidates: CandidateRow, db: str = "prod.duckdb") -> tuple[list[list[str]], str]:
        result = SimpleNamespace(candidates=list(candidates), skipped=[], anytime=[], monitors=[], tests=[],
                                 mlflow_run_ids=[], alerts=[], withdrawn={}, pages=[], log_error=None, promoted=[],
                                 serving=[], registry_error=None)
        print_recalibration_notes(result, False, "nothing", db=db)
        said = " ".join(capsys.readouterr().out.split())
        return _commands(said), said

    other = "paper" if DEFAULT_SEARCH != "paper" else "fallback"
    quiet_other, quiet_default, loud = ("1" * 16, other, []), ("2" * 16, DEFAULT_SEARCH, []), ("3" * 16, DEFAULT_SEARCH,
                                                                                              ["drift: moved"])
    assert closing(candidate(*loud), candidate(*quiet_other), candidate(*quiet_default))[0] == [
        ["cic", "gate", "list", "--db", "prod.duckdb", "--state", "candidate"],
        ["cic", "gate", "promote", "2" * 12, "--db", "prod.duckdb"]]
    commands, said = closing(candidate(*loud), db="cic.duckdb")
    assert commands[1] == ["cic", "gate", "promote", "3" * 12, "--despite-alerts"] and "(drift: moved)" in said
