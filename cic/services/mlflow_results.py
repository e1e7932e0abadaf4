"""Log what the store holds to MLflow, skipping groups already logged: the pipeline's log task, `cic log` and
`cic log TABLE` all call `log_store`; the recalibration flow calls `log_recalibration`. What each run holds is
`mlflow_layout`'s.

Everything logged comes from DuckDB (runs, calibrations, evaluations and the pairs themselves), so a flow
whose tracking server was down loses nothing: the next flow run or `cic log` logs the missing groups, and
the `cic.log_key` tag (a hash of the evaluation id and the gate ids) keeps reruns from duplicating runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from cic.errors import ServiceDown
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.production.recalibration import RecalibrationPass
from cic.pipeline.run import progress
from cic.pipeline.run.group_reports import (
    UnitReport,
    log_key,
    log_units,
    pipeline_calibrations,
    read_unit,
    render_units,
)
from cic.pipeline.run.run_results import LogStats
from cic.reports.report_index import write_report_index
from cic.services.mlflow_artifacts import sqlite_file
from cic.services.mlflow_layout import experiment_prefix_of, pipeline_group, recalibration_groups, system_groups
from cic.services.mlflow_setup import check_before_logging
from cic.services.mlflow_tracking import check_reachable, find_logged, log_group, requests_in_flight, tracking_uri
from cic.services.mlflow_view import publish
from cic.stats.searches import DEFAULT_SEARCH
from cic.store import Store
from cic.store.outputs import guard_output_dir

GROUPS_IN_FLIGHT = 2  # against a server: one group sent while the next renders (x REQUESTS_IN_FLIGHT each)


def log_store(db: str, *, tracking: str | None = None, experiment_prefix: str | None = None,
                report_dir: str = "cic-reports", run_keys: Sequence[str] | None = None,
                flow_run_id: str | None = None, extra_tags: dict[str, str] | None = None) -> LogStats:
    """Log every stored unit not yet in MLflow (a run per group, its per-α table: `mlflow_layout`), tagged
    with the Prefect flow run that logged it (`cic.flow_run_id`) when there is one, and `extra_tags`.

    Each group goes to '<prefix>-<dataset>', the prefix being `experiment_prefix` or, when None, the one the
    run's config recorded in the store — so `cic log` after `cic run` finds everything already there.
    """
    uri = tracking_uri(tracking)
    check_reachable(uri)
    check_before_logging(uri)
    guard_output_dir(report_dir, "report_dir")  # cic's own directory (marked), never one holding other files
    client = MlflowClient(tracking_uri=uri)
    in_flight = requests_in_flight(uri)
    sent: dict[int, Future[tuple[str, bool]]] = {}  # per unit (by its index): (run id, newly logged)
    units: list[Any] = []
    try:
        return _log_units(db, client, uri, units, sent, experiment_prefix=experiment_prefix, report_dir=report_dir,
                          run_keys=run_keys, flow_run_id=flow_run_id, in_flight=in_flight,
                          extra_tags=extra_tags or {})
    except Exception as exc:
        raise _stopped_answering(uri, exc, sent, len(units)) from None


def _stopped_answering(uri: str, exc: Exception, sent: dict[int, Future[tuple[str, bool]]],
                       total: int) -> Exception:
    """A failure while logging, in one line when the tracking server stopped answering meanwhile (what was
    logged, and `cic log` to finish: logged groups are found and skipped); any other failure as it is."""
    if isinstance(exc, ServiceDown):
        return exc
    try:
        check_reachable(uri)
    except ServiceDown:
        done = sum(f.done() and not f.cancelled() and f.exception() is None for f in sent.values())
        return ServiceDown(f"MLflow tracking server {uri} stopped answering while results were logged: {done} of "
                           f"{total} group(s) logged before it did ({type(exc).__name__}); the results stay in the "
                           "store — rerun `cic log` when it answers again (groups already logged are found and "
                           "skipped)")
    return exc


def _log_units(db: str, client: MlflowClient, uri: str, units: list[Any], sent: dict[int, Future[tuple[str, bool]]],
               *, experiment_prefix: str | None, report_dir: str, run_keys: Sequence[str] | None,
               flow_run_id: str | None, in_flight: int, extra_tags: dict[str, str]) -> LogStats:
    """`log_store`'s work: `units` and `sent` are filled as it goes, so a failure can say how far it got."""
    with Store.open(db, read_only=True, wait_s=60) as store, \
            ThreadPoolExecutor(GROUPS_IN_FLIGHT if in_flight > 1 else 1, thread_name_prefix="cic-log") as pool:
        try:
            return _send(store, client, pool, units, sent, experiment_prefix=experiment_prefix,
                         report_dir=report_dir, run_keys=run_keys, flow_run_id=flow_run_id, in_flight=in_flight,
                          extra_tags=extra_tags or {})
        except Exception:
            pool.shutdown(wait=False, cancel_futures=True)  # groups not started yet are not sent into a failure
            raise


def _send(store: Store, client: MlflowClient, pool: ThreadPoolExecutor, units: list[Any],
          sent: dict[int, Future[tuple[str, bool]]], *, experiment_prefix: str | None, report_dir: str,
          run_keys: Sequence[str] | None, flow_run_id: str | None, in_flight: int,
          extra_tags: dict[str, str]) -> LogStats:
    """Find what is logged already, then read, render and send every other group (systems first)."""
    units.extend(log_units(store, run_keys))
    found = _already_logged(client, pool, store, units)
    for index, existing in enumerate(found):
        if existing is not None:
            sent[index] = Future()
            sent[index].set_result((existing, False))
    systems = system_groups(store, run_keys, experiment_prefix)  # cascades and estimators chosen: no report,
    system_runs = [pool.submit(log_group, client, group, in_flight=in_flight) for group in systems]  # sent now
    started = time.perf_counter()
    todo = [index for index, existing in enumerate(found) if existing is None]
    index_of: dict[Path, int] = {}

    def read(index: int) -> UnitReport:
        report = read_unit(store, units[index], Path(report_dir))
        index_of[report.out] = index
        return report

    # read one group after the other here while the groups read before render (in worker processes when
    # there are many) and the groups rendered before are sent
    for report in render_units((read(index) for index in todo), len(todo)):
        index = index_of[report.out]
        group = pipeline_group(store, units[index], report,
                               experiment_prefix_of(store, units[index].group.run_key, experiment_prefix))
        if flow_run_id:  # which Prefect flow run logged it: from the MLflow run to its logs and back
            group = replace(group, tags={**group.tags, "cic.flow_run_id": flow_run_id})
        if extra_tags:
            group = replace(group, tags={**group.tags, **extra_tags})
        sent[index] = pool.submit(log_group, client, group, in_flight=in_flight)
        _report_progress(list(sent.values()), len(units))
    if todo or not (Path(report_dir) / "README.md").exists():
        write_report_index(Path(report_dir))  # the folder's front page: every group, every estimator compared
    report_s = time.perf_counter() - started
    for _ in as_completed(sent.values()):
        _report_progress(list(sent.values()), len(units))
    stats = LogStats(report_s=report_s)
    for future in system_runs:
        run_id, new = future.result()
        stats.logged += int(new)
        stats.already += int(not new)
        stats.run_ids.append(run_id)
    for index in sorted(sent):
        run_id, new = sent[index].result()
        stats.logged += int(new)
        stats.already += int(not new)
        stats.run_ids.append(run_id)
    names = {f"{experiment_prefix_of(store, unit.group.run_key, experiment_prefix)}-{unit.group.dataset}"
             for unit in units}
    stats.views = publish_views(client, sorted(names))
    return stats


def publish_views(client: MlflowClient, names: Sequence[str]) -> dict[str, str]:
    """Save or refresh each experiment's α view (`mlflow_view`); returns experiment name -> UI route."""
    views = {}
    for name in names:
        found = client.get_experiment_by_name(name)
        if found is not None and (route := publish(client, found.experiment_id, [f"cp.{DEFAULT_SEARCH}"])):
            views[name] = route
    return views


def _already_logged(client: MlflowClient, pool: ThreadPoolExecutor, store: Store, units: list[Any]
                    ) -> list[str | None]:
    """Per unit, the MLflow run that already holds it (its log key found), else None; looked up concurrently."""
    keys = [log_key(unit.evaluation_id, pipeline_calibrations(store, unit)) for unit in units]
    return list(pool.map(lambda key: find_logged(client, key), keys))


def _report_progress(futures: list[Future[tuple[str, bool]]], total: int) -> None:
    """Progress counts groups whose logging finished; a group that failed stops the pass at once (its error
    raised here), not after every other group."""
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()
    progress.report("log", sum(future.done() for future in futures), total)


def log_recalibration(result: RecalibrationPass, *, tracking: str | None = None,
                      experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX, flow_run_id: str | None = None) -> list[str]:
    """One run per recalibrated group (the pipeline's layout, cic.kind = recalibration); returns the run ids."""
    uri = tracking_uri(tracking)
    check_reachable(uri)
    check_before_logging(uri)
    client = MlflowClient(tracking_uri=uri)
    groups = recalibration_groups(result, experiment_prefix, flow_run_id)
    run_ids = []
    for done, group in enumerate(groups, 1):
        run_ids.append(log_group(client, group, in_flight=requests_in_flight(uri))[0])
        progress.report("log recalibrations", done, len(groups))
    return run_ids


TABLE_TAG = "cic.table_key"  # on each run `cic log TABLE` logged: the table's content, the split count, CIC's rules


def table_already_logged(tracking: str | None, table_key: str, groups: int, experiments: Sequence[str]
                         ) -> LogStats | None:
    """A table `cic log TABLE` logged before, as it is now (every one of its `groups` a finished run tagged with
    its key): what a rerun would find, without calibrating anything again; None when a group is missing."""
    uri = tracking_uri(tracking)
    local = sqlite_file(uri)
    if local is not None and not local.exists():
        return None  # nothing logged there yet (and no store made by looking)
    check_reachable(uri)
    check_before_logging(uri, create=False)
    client = MlflowClient(tracking_uri=uri)
    everywhere = [e.experiment_id for e in client.search_experiments()]
    if not everywhere:
        return None
    runs = client.search_runs(everywhere, filter_string=f"tags.`{TABLE_TAG}` = '{table_key}' and "
                                                        "attributes.status = 'FINISHED'", max_results=groups + 1)
    if len(runs) != groups:
        return None
    return LogStats(already=groups, run_ids=[r.info.run_id for r in runs], views=publish_views(client, experiments))
