"""The command runner: the one way a `cic` command runs a flow — the moved-MLflow-store check before any service
starts, the services owned for exactly the flow's duration (stopped in order, also on SIGTERM), the console's
progress view, and the flow's outcome (its typed summary, and whether it ended Failed on purpose)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cic.cli.common import console, flow_outcome
from cic.cli.progress_view import progress_view
from cic.cli.service_logs import services_logged_to
from cic.cli.services import command_services


def refuse_moved_mlflow_store(explicit: str | None) -> None:
    """Before any work: a moved local MLflow store would get its new artifacts in the old folder."""
    from cic.services.mlflow_setup import check_before_logging
    from cic.services.mlflow_tracking import tracking_uri

    check_before_logging(tracking_uri(explicit), create=False)  # a refusal later must leave nothing behind


def run_flow(flow: Callable[..., Any], failure: type[BaseException], *, store: str | Path, command: str,
             mlflow_uri: str | None, **parameters: Any) -> tuple[Any, bool, Path]:
    """Run `flow(**parameters)` as command `command` on store file `store`, logging to `mlflow_uri` unless the
    flow's `log_to_mlflow` is False; returns (summary, failed, services log). `failure` is the exception a run
    that ended Failed on purpose carries its summary in (a failed model, an alert); any other exception is
    raised with its traceback."""
    from cic.services.prefect_api import check_prefect_api

    check_prefect_api()
    if parameters.get("log_to_mlflow", True):
        refuse_moved_mlflow_store(mlflow_uri)
    with command_services(store, command=command) as service_log, progress_view():
        console.print(f"cic {command}: starting its Prefect flow run{' and Ray' if command == 'run' else ''}; the "
                      "stages follow", highlight=False, markup=False)
        state = flow(**parameters, return_state=True)
    summary, failed = flow_outcome(state, failure)
    return summary, failed, service_log


@contextmanager
def without_flow(services_log: Path) -> Iterator[None]:
    """A command that talks to MLflow without a flow (`cic log`, `cic gate sync`): the services' chatter goes to
    their log, progress to the console."""
    with services_logged_to(services_log), progress_view():
        yield
