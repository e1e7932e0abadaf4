"""Options declared once (`cic.cli.option_groups`): a grouped command gets its group filled from the command line,
the commands sharing a group show the same options, and every command reads in one screen."""

from __future__ import annotations

import ast
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

import typer
import typer.main
from typer.testing import CliRunner

from cic.cli import app
from cic.cli.option_groups import Columns, Grid, Splits, grouped

runner = CliRunner()
CLI = Path(__file__).resolve().parents[2] / "cic" / "cli"
MAX_COMMAND_LINES = 40


@dataclass(frozen=True)
class Pair:
    left: Annotated[int, typer.Option("--left", help="The left value.")] = 1
    right: Annotated[str, typer.Option("--right", help="The right value.")] = "r"


def test_a_grouped_command_gets_its_group_built_from_the_command_line() -> None:
    seen: list[object] = []
    demo = typer.Typer()

    @demo.command()
    @grouped
    def show(name: Annotated[str, typer.Argument(help="A name.")], *, pair: Pair,
             loud: Annotated[bool, typer.Option("--loud", help="Shout.")] = False) -> None:
        seen.append((name, pair, loud))

    result = runner.invoke(demo, ["x", "--left", "7", "--loud"])
    assert result.exit_code == 0, result.output
    assert seen == [("x", Pair(left=7, right="r"), True)]
    assert "--right" in runner.invoke(demo, ["--help"]).output


def _options(path: str) -> dict[str, tuple[object, str]]:
    command = typer.main.get_command(app).commands[path]  # type: ignore[attr-defined]
    return {p.opts[0]: (p.default, p.help) for p in command.params if p.opts[0].startswith("--")}


def test_commands_sharing_a_group_show_its_options_alike() -> None:
    """evaluate and report take the same columns and splits; calibrate and evaluate the same grid: one
    declaration each, so a changed default or help reads the same in every command."""
    shared = {("evaluate", "report"): (Columns, Splits), ("calibrate", "evaluate"): (Columns, Grid)}
    for commands, groups in shared.items():
        options = [_options(c) for c in commands]
        for group in groups:
            for field in fields(group):
                flag = "--" + field.name.replace("_", "-")
                assert options[0][flag] == options[1][flag], (commands, flag)


def test_every_command_reads_in_one_screen() -> None:
    """A command's function (signature included) is at most 40 lines: the rest lives in named helpers."""
    long = []
    for file in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    getattr(d, "id", None) == "friendly_errors" for d in node.decorator_list):
                if node.end_lineno - node.lineno + 1 > MAX_COMMAND_LINES:
                    long.append(f"{file.name}:{node.name} {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


def test_a_bracket_in_help_is_shown_not_eaten_as_markup() -> None:
    result = runner.invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200"})
    assert "'semantic_entropy[embedding:0.9]'" in result.output, result.output
