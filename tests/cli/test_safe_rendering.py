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
