"""`cic mlflow …`: the local MLflow store around CIC's runs (its artifact paths after a move)."""

from __future__ import annotations

import typer

from cic.cli.common import TrackingOpt, console, friendly_errors, printable
from cic.cli.help_format import ReadableCommand, ReadableGroup

mlflow_app = typer.Typer(no_args_is_help=True, cls=ReadableGroup,
                         help="Look after the MLflow store CIC logs to (a moved local store's artifact paths).")


@mlflow_app.command("relocate", cls=ReadableCommand)
@friendly_errors
def relocate_store(tracking_uri: TrackingOpt = None) -> None:
    """After moving or copying a local SQLite store with its mlartifacts folder: point its experiments, runs
    and registered gates at the artifacts beside it again (MLflow records absolute paths). Idempotent."""
    from cic.services.mlflow_artifacts import relocate
    from cic.services.mlflow_tracking import tracking_uri as resolve

    uri = resolve(tracking_uri)
    moved = relocate(uri)
    if not moved:
        console.print(printable(f"nothing to relocate: every experiment CIC created in {uri} keeps its artifacts "
                                f"beside the store"), soft_wrap=True)
    for experiment in moved:
        console.print(printable(f"{experiment.name}: {experiment.recorded} → {experiment.present}"), soft_wrap=True)


GROUPS = {"mlflow": mlflow_app}
