"""The `cic` command line: one Typer app, its commands in one module per group.

`stats` works on precomputed (score, error) tables, `store` on datasets and the DuckDB store, `pipeline`
runs and serves the batch pipeline. Each module lists its commands in `COMMANDS`; this module registers them.
"""

from __future__ import annotations

import typer

from cic.cli import pipeline, stats, store

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="CIC: certified abstention thresholds for LLM answers.")
for group in (stats, store, pipeline):
    for command_name, command in group.COMMANDS.items():
        app.command(command_name)(command)

__all__ = ["app"]
