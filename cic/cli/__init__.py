"""The `cic` command line: one Typer app, its commands in one module per group.

`stats` works on precomputed (score, error) tables (`studies`: simulate, report, bench, validity), `store` on
datasets and the DuckDB store, `pipeline` runs and serves the batch pipeline,
`gates` takes production traffic in and moves gates between states, `mlflow_store` looks after the local
MLflow store; `runner` is how every command runs a flow. Each module lists its commands in
`COMMANDS` (and sub-apps in `GROUPS`); this module registers them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cic.cli import gates, mlflow_store, pipeline, stats, store, studies
from cic.cli.help_format import ReadableCommand, ReadableGroup
from cic.cli.services import service_defaults

app = typer.Typer(add_completion=False, no_args_is_help=True, cls=ReadableGroup,
                  help="CIC: certified abstention thresholds for LLM answers.")
for group in (stats, studies, store, pipeline, gates):
    for command_name, command in group.COMMANDS.items():
        app.command(command_name, cls=ReadableCommand)(command)
for group_name, sub_app in {**gates.GROUPS, **mlflow_store.GROUPS}.items():
    app.add_typer(sub_app, name=group_name)


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        typer.echo(f"cic {version('cic')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print cic's version and exit.")] = False) -> None:
    """CIC: certified abstention thresholds for LLM answers."""
    service_defaults()

__all__ = ["app"]
