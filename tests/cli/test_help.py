"""Help a person reads: every option explained, values named FILE/TEXT/NUMBER, no Python types, `--version`."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from cic.cli import app

runner = CliRunner()


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    children = getattr(command, "commands", None)
    if children:
        yield path, command
        for name, child in children.items():
            yield from _commands(child, (*path, name))
    else:
        yield path, command


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_every_command_is_walked() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"calibrate", "run", "recalibrate", "ingest", "gate list", "gate sync", "report"} <= names


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p) or "cic")
def test_help_explains_every_option_and_names_values_for_people(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    unexplained = [p.opts[0] for p in command.params if not (getattr(p, "help", None) or "").strip()
                   and p.opts[0].startswith("--")]
    assert not unexplained, f"cic {' '.join(path)}: options without help: {unexplained}"
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage and "<bool>" not in result.output and "<str>" not in result.output, result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"cic {version('cic')}"


def test_one_search_default_everywhere() -> None:
    """`fallback` (a simultaneous guarantee, DEFAULT_SEARCH) is every command's default; `paper` only when asked."""
    defaults = {" ".join(path): p.default for path, command in COMMANDS for p in command.params
                if p.opts and p.opts[0] == "--search"}
    assert {"calibrate", "evaluate", "report", "simulate", "ask"} <= set(defaults)
    assert set(defaults.values()) == {"fallback"}, defaults


def test_one_experiment_prefix_default() -> None:
    from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX, load_config

    defaults = {" ".join(path): p.default for path, command in COMMANDS for p in command.params
                if p.opts and p.opts[0] == "--experiment-prefix" and p.default is not None}
    assert {"ingest", "gate promote", "gate sync"} <= set(defaults)
    assert set(defaults.values()) == {DEFAULT_EXPERIMENT_PREFIX} == {load_config("demo").mlflow.experiment_prefix}


@pytest.mark.parametrize("path,option", [(("calibrate",), "--bound"), (("calibrate",), "--search"),
                                         (("evaluate",), "--bounds"), (("validity",), "--bounds"),
                                         (("validity",), "--searches"), (("ask",), "--bound")])
def test_bound_and_search_help_names_every_registered_one(path: tuple[str, ...], option: str) -> None:
    """The help lists what the registries hold, so a new bound or search shows up in every help text at once."""
    from cic.stats.bounds import BOUND_NAMES
    from cic.stats.searches import SEARCHES

    (param,) = [p for p in dict(COMMANDS)[path].params if option in p.opts]
    names = BOUND_NAMES if "bound" in option else tuple(SEARCHES)
    missing = [n for n in names if n not in param.help]
    assert not missing, f"{' '.join(path)} {option} help misses {missing}: {param.help}"
