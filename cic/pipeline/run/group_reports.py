"""Each stored group's report (tables and figures, from the store): what `cic run` writes beside MLflow, and
alone with `--no-mlflow`; the MLflow layout attaches the same directories as artifacts."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.run.stored_calibration import GroupKey
from cic.reports.report import ReportConfig, file_slug, write_report
from cic.reports.report_index import write_report_index
from cic.stats.searches import get_search
from cic.store import Store
from cic.store.outputs import guard_output_dir, write_frame, write_text
from cic.store.probe_queries import probe_artifact
from cic.store.queries import generations_per_question, loggable_units

PARALLEL_FROM = 6  # groups: from this many on, reports render in worker processes
log = logging.getLogger("cic.reports")


@dataclass(frozen=True)
class UnitReport:
    """One group's report directory and the stored rows it is rendered from (everything a renderer needs, so a
    worker process renders it without opening the store)."""

    out: Path
    key: str                    # the group's key: its evaluation and gates (`log_key`)
    run: dict[str, Any]
    calibrations: pl.DataFrame
    evaluations: pl.DataFrame
    pairs: pl.DataFrame
    searches: tuple[str, ...]
    frame: pl.DataFrame         # the (score, error) table the report is drawn from
    config: ReportConfig
    generations: float | None = None  # answers generated a question for the run (fewer under adaptive rounds)
    probe: str | None = None  # the probe (JSON) whose score this is, logged beside its report as probe.json


@dataclass(frozen=True)
class StoredUnit:
    """One loggable unit: a calibration group with its stored evaluation and the fingerprint of its data (what
    `cic log` logs as one MLflow run)."""

    group: GroupKey
    evaluation_id: str
    data_fingerprint: str


def log_units(store: Store, run_keys: Sequence[str] | None = None) -> list[StoredUnit]:
    """The loggable units: one per stored evaluation with the pipeline gates of the same data."""
    return [StoredUnit(GroupKey(u["run_key"], u["model"], u["dataset"], u["estimator"], u["criterion"]),
                       u["evaluation_id"], u["data_fingerprint"])
            for u in loggable_units(store) if run_keys is None or u["run_key"] in set(run_keys)]


def pipeline_calibrations(store: Store, unit: StoredUnit) -> pl.DataFrame:
    """The pipeline's gates of one unit (a recalibration's gates are logged by the recalibrate flow)."""
    calibrations = store.read("calibrations", run_key=unit.group.run_key, estimator=unit.group.estimator,
                              criterion=unit.group.criterion, data_fingerprint=unit.data_fingerprint)
    return calibrations.filter(pl.col("kind").fill_null("pipeline") == "pipeline")


def log_key(evaluation_id: str, calibrations: pl.DataFrame) -> str:
    """A unit's MLflow idempotency key (`cic.log_key`): its evaluation and the ids of its gates, so a unit is
    logged once and a unit whose gates changed is logged anew."""
    return schema.stable_hash(evaluation_id, *calibrations.get_column("calibration_id").sort().to_list())


def read_unit(store: Store, unit: StoredUnit, report_root: Path) -> UnitReport:
    """One group's stored rows and where its report goes (a directory named by the group and its key)."""
    group = unit.group
    run = store.read("runs", run_key=group.run_key).row(0, named=True)
    calibrations = pipeline_calibrations(store, unit)
    evaluations = store.read("evaluations", evaluation_id=unit.evaluation_id)
    first = evaluations.row(0, named=True)
    pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                    run_key=group.run_key, allow_partial=True)
    key = log_key(unit.evaluation_id, calibrations)
    out = report_root / file_slug(group.model, group.dataset, group.estimator, group.criterion, key[:10])
    frame = pairs.select(pl.lit(group.model).alias("model"), pl.lit(group.dataset).alias("dataset"),
                         pl.lit(group.estimator).alias("estimator"), pl.lit(group.criterion).alias("criterion"),
                         "score", "error")
    searches = tuple(dict.fromkeys(evaluations.get_column("search").to_list()))
    config = ReportConfig(alphas=tuple(sorted(set(evaluations.get_column("alpha").to_list()))),
                          bounds=tuple(dict.fromkeys(evaluations.get_column("bound").to_list())),
                          searches=tuple(s for s in searches if not get_search(s).needs_grid) or ("paper",),
                          delta=first["delta"], n_splits=first["n_splits"], cal_fraction=first["cal_fraction"],
                          seed=first["seed"], sensitivity_fractions=(), baselines=(), budget_sizes=())
    return UnitReport(out, key, run, calibrations, evaluations, pairs, searches, frame, config,
                      generations_per_question(store, group.run_key),
                      probe_artifact(store, group.run_key, group.estimator))


def render_unit(report: UnitReport) -> UnitReport:
    """Render one group's paper tables and figures, and its evaluation rows as CSV (the stored protocol rows: the
    protocol is not run again). A module-level function of picklable data: it runs in a worker process too."""
    write_report(report.frame, report.out, report.config, stored=report.evaluations)
    write_frame(report.evaluations, report.out / "tables" / "evaluations.csv", "--report-dir")
    if report.generations is not None:  # what the score cost, beside what it certifies
        index = report.out / "README.md"
        write_text(index, index.read_text() + f"\nGenerations a question (the most likely answer and the samples "
                   f"drawn, run {report.run['run_key']}): {report.generations:.2f}.\n", "report file")
    if report.probe is not None:  # the learned score itself: weights, layers, fit split (cic.llm.probes)
        write_text(report.out / "probe.json", report.probe, "report file")
        index = report.out / "README.md"
        write_text(index, index.read_text() + "\nThis score is a probe on the greedy pass's kept hidden states "
                   "(probe.json: its layers, weights and the questions it was fitted on, none of them among "
                   "the questions certified here): served, it costs that one generation a question.\n",
                   "report file")
    return report


def render_units(reports: Iterable[UnitReport], count: int) -> Iterator[UnitReport]:
    """Render `count` groups, yielding each as it is done: in worker processes (`report_workers`, at most one per
    group) when there are PARALLEL_FROM groups or more and more than one worker, else here, one after the other
    (starting a process costs a second or two: not worth it for a few groups). `reports` may be lazy: each group
    is rendered as soon as it is read; the workers are those `start_report_workers` started, else new ones that
    warm up while the groups are read."""
    workers = min(count, report_workers())
    if count < PARALLEL_FROM or workers < 2:
        stop_report_workers()  # started ahead for nothing: too few groups to be worth a process
        yield from (render_unit(r) for r in reports)
        return
    pending, read, rendered = iter(reports), [], set()
    try:
        with _take_workers(workers) as pool:
            futures = []
            for report in pending:  # each group is rendered as soon as it is read, while the next one is read
                read.append(report)
                futures.append(pool.submit(render_unit, report))
            for done in as_completed(futures):
                rendered.add(done.result().out)
                yield done.result()
    except BrokenProcessPool:  # e.g. a script calling this without `if __name__ == "__main__":` (spawn needs it)
        log.warning("report worker processes could not start; rendering the reports in this process")
        yield from (render_unit(r) for r in [*read, *pending] if r.out not in rendered)


_ahead: ProcessPoolExecutor | None = None  # workers `start_report_workers` started, until reports take them


def start_report_workers() -> None:
    """Start the report worker processes now and warm them up (imports, fonts), so the next `render_units` finds
    them ready: `cic run` calls this as its single-threaded calibration starts, on the core it leaves idle."""
    global _ahead
    if _ahead is None and report_workers() >= 2:
        _ahead = _spawn(report_workers())


def stop_report_workers() -> None:
    """Stop workers started ahead and not taken (a run that failed before its reports, too few groups)."""
    global _ahead
    if _ahead is not None:
        _ahead.shutdown(wait=False, cancel_futures=True)
        _ahead = None


def _take_workers(workers: int) -> ProcessPoolExecutor:
    """The workers started ahead, or `workers` new ones (warming up while the next group is read)."""
    global _ahead
    pool, _ahead = _ahead, None
    return pool if pool is not None else _spawn(workers)


def _spawn(workers: int) -> ProcessPoolExecutor:
    """Spawned, not forked (the flow's process runs threads: Prefect's, the MLflow senders); each warms up first."""
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
    for _ in range(workers):
        pool.submit(warm_up)
    return pool


def report_workers() -> int:
    """How many processes render reports: $CIC_REPORT_WORKERS (1 renders here, one group after the other), else
    one per core."""
    value = os.environ.get("CIC_REPORT_WORKERS")
    if value is None:
        return os.cpu_count() or 1
    if not value.strip().isdigit() or int(value) < 1:
        raise UserError(f"CIC_REPORT_WORKERS = {value!r}: expected an integer >= 1 (1 renders reports in this "
                        "process)")
    return int(value)


def warm_up() -> None:
    """A worker's first job: import the renderer and draw one small figure (fonts loaded), off the clock of the
    first group it renders."""
    import io

    from matplotlib.figure import Figure

    from cic.reports import report  # noqa: F401 - the import is the point

    figure = Figure(figsize=(1, 1))
    figure.subplots().set_title("α")
    figure.savefig(io.BytesIO(), format="png")


def write_group_reports(db: str, report_dir: str, run_keys: Sequence[str] | None = None) -> list[Path]:
    """Every stored group's report under `report_dir` (cic's own directory, never one holding other files)."""
    guard_output_dir(report_dir, "report_dir")
    with Store.open(db, read_only=True, wait_s=60) as store:
        units = log_units(store, run_keys)
        reports = [read_unit(store, unit, Path(report_dir)) for unit in units]
    for _ in render_units(reports, len(reports)):
        pass
    write_report_index(Path(report_dir))  # the folder's front page: every group, every estimator compared
    return [report.out for report in reports]
