"""Advice that works when followed: a withdrawal's restore advice names the flag its candidate needs and why, and
every `cic gate …` command a console prints names the store the printing command read (run as printed)."""

from __future__ import annotations

import re
import shlex

from cic.cli.common import on_store
from cic.pipeline.gates.serving_state import restore_advice

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
