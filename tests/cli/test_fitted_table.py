"""Tables and messages at a piped console's width: every word whole (a line breaks between words, never inside
one), every line within the width unless one word is wider — the candidate table of `cic recalibrate` too."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from cic.cli.common import console
from cic.cli.pipeline import print_candidates
from cic.pipeline.run.run_results import CandidateRow, GroupPlace

LONG = "semantic_entropy_weighted[embedding:0.9]"
MODEL = "qwen2.5-coder-1.5b-instruct"


def _candidates(estimators: tuple[str, ...]) -> SimpleNamespace:
    rows = [CandidateRow(GroupPlace(MODEL, "commonsense_qa", est, "option_match", alpha, "cp", "fallback"),
                         f"{i:02d}3f2a9c81d0e4ab", "candidate", 0.3260041, 412, None if alpha < 0.1 else 0.31,
                         ["drift: score distribution moved"] if i == 0 else [])
            for i, (est, alpha) in enumerate((e, a) for e in estimators for a in (0.05, 0.2))]
    return SimpleNamespace(candidates=rows, gates=len(rows), monitors=[])


@pytest.mark.parametrize("columns", [60, 100, 250])
def test_the_candidate_table_keeps_every_word_whole_at_any_width(columns: int, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    print_candidates(_candidates((LONG, "predictive_entropy")))
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= columns, lines
    words = set(re.split(r"[\s│┃]+", "\n".join(lines)))
    assert {MODEL, "commonsense_qa", LONG, "option_match", "predictive_entropy", "0.326"} <= words, (columns, lines)
    assert "…" not in "\n".join(lines)
    table = any(line.split()[:2] == ["gate", "state"] for line in lines)
    assert table == (columns == 250)  # a table only where every column fits at its longest word


def test_one_group_is_named_once_in_the_title(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    print_candidates(_candidates(("predictive_entropy",)))
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["gate", "state"])
    title = " ".join(" ".join(lines[:header]).split())
    assert title == f"recalibration: 2 candidate gate(s) of {MODEL}/commonsense_qa predictive_entropy × option_match"
    assert sum(MODEL in line for line in lines) == 1


@pytest.mark.parametrize("columns", [40, 100])
def test_a_message_breaks_between_words_and_keeps_a_long_path_whole(
        columns: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    path = "/srv/cic/nightly/" + "x" * 70 + "/prod.duckdb"
    words = ["results", "are", "in", path, "run", "`cic", "log`", "to", "log", "them"] * 3
    console.print(" ".join(words))
    lines = capsys.readouterr().out.splitlines()
    assert [w for line in lines for w in line.split()] == words  # nothing folded inside a word
    assert all(len(line) <= columns or line == path for line in lines), lines
    assert all(len(line) <= columns for line in lines) or sum(line == path for line in lines) == 3


@pytest.mark.parametrize("columns", [70, 100, 120, 160])
def test_any_table_a_command_prints_keeps_its_values_whole(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cic evaluate`'s bordered table (twelve columns, the two limits included): drawn with every column at least
    its longest word where that fits (from 120 columns), else a block per row — no "…", no word folded, no line past
    the width."""
    from pathlib import Path

    from typer.testing import CliRunner

    from cic.cli import app

    monkeypatch.setenv("COLUMNS", str(columns))
    table = Path(__file__).resolve().parents[2] / "infra" / "examples" / "scores_demo.csv"
    done = CliRunner().invoke(app, ["evaluate", str(table), "--alphas", "0.1,0.2", "--n-splits", "5"],
                              env={"COLUMNS": str(columns)})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert max(map(len, lines)) <= columns and "…" not in done.output, done.output
    words = set(re.split(r"[\s│┃:]+", done.output))
    assert {"hoeffding", "fallback", "guarantee", "coverage", "threshold"} <= words, done.output
    assert any("┃" in line for line in lines) == (columns >= 120)  # a table where it fits, else blocks


def test_a_table_without_rows_prints_its_header(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.table import Table

    monkeypatch.setenv("COLUMNS", "100")
    table = Table(title="live gates: 0")
    for name in ("gate", "state"):
        table.add_column(name)
    console.print(table)
    assert "gate" in capsys.readouterr().out
