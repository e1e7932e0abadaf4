"""The main job: every model × dataset at once, generate → score → label → store, then calibrate, evaluate, log.

    questions ──► answer (a Ray pool per model, all at once) ──► DuckDB ──► calibrate + split protocol ──► MLflow
                          └──(storage.landing) Delta table ──load once──┘

A model that fails (cannot be placed, cannot load, keeps failing batches) is reported with its error while the
others finish, are calibrated and logged; the run then ends Failed naming it, and a rerun retries only it.

Work already in DuckDB is not redone: each run's unfinished questions are computed from the store
(`cic.store.resume`), so a rerun adds nothing and a killed run resumes where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from prefect import flow
from prefect.states import Failed, State

from cic.llm.engines import EngineProbe
from cic.pipeline.config import DEMO_CONFIG, PipelineConfig, flow_config
from cic.pipeline.gates.serving_now import live_gate_ids
from cic.pipeline.gates.system_gates import system_results
from cic.pipeline.run import progress
from cic.pipeline.run.group_reports import start_report_workers, stop_report_workers, write_group_reports
from cic.pipeline.run.preflight import probe_lines, probe_models
from cic.pipeline.run.progress import ProgressLines
from cic.pipeline.run.run_digest import PER_DATASET_UNSHARED, RESULTS_ARTIFACT, markdown_summary
from cic.pipeline.run.run_results import PipelineSummary, ResultRow
from cic.services import ray_pool
from cic.services.answer_stage import ModelJob, RunJob, plan_placement
from cic.services.mlflow_tracking import tracking_uri
from cic.services.prefect_limits import store_slot
from cic.services.prefect_runs import flow_run_name, run_logger
from cic.services.registry_sync import registry_sync
from cic.store import Store
from cic.store.landing import load_landing
from cic.store.queries import latest_group_results, latest_results
from cic.store.resume import missing_work
from tasks.answer import answer_questions
from tasks.calibrate import calibrate_runs
from tasks.log import log_results
from tasks.probes import fit_probes
from tasks.questions import load_and_store_questions


class ModelsFailed(RuntimeError):
    """Raised at the end of a pipeline run in which some models failed (the others finished and were calibrated
    and logged); `summary` says what happened. The flow run ends Failed naming them; a rerun retries only them."""

    def __init__(self, summary: PipelineSummary) -> None:
        failed = [f"{a.model} ({a.error})" for a in summary.failed_models]
        super().__init__(f"{len(failed)} model(s) failed: " + "; ".join(failed))
        self.summary = summary


@flow(name="cic-pipeline", flow_run_name=flow_run_name(), log_prints=True)
def pipeline(config_path: str = DEMO_CONFIG, db: str | None = None, ray_address: str | None = None,
             tracking: str | None = None, report_dir: str | None = None,
             log_to_mlflow: bool = True, probes: dict[str, dict[str, Any]] | None = None,
             config: Any = None) -> PipelineSummary | State:
    """Run the whole job for the config; returns a summary (also the flow run's result).

    Stage progress goes to the flow run's log (the Prefect UI, a worker's output) at least every 30 s while a
    stage runs, whoever started the flow: `cic run`, a deployment's schedule or plain Python. When a model
    fails, the run ends Failed (a direct call raises `ModelsFailed`; `return_state=True` returns the state,
    whose result is that exception with its `.summary`). `probes`: what `cic run` already found when it probed
    every model's engine (model -> identity and state); the flow probes them itself otherwise, once. `config`:
    the `PipelineConfig` `cic run` already parsed from `config_path` (a deployment passes the path alone; typed
    `Any`: a served deployment builds its parameter schema without the config's module).
    """
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.runtime import flow_run

    run_id = str(flow_run.id) if flow_run.id else None
    config = flow_config(config_path, config, db, ray_address, tracking, report_dir)
    storage = config.storage
    with store_slot(storage.concurrency_limit, timeout_s=storage.queue_timeout_s), ProgressLines(get_run_logger().info):
        summary = run_stages(config, log_to_mlflow, flow_run_id=run_id, probes=probes)
    summary.flow_run_id = run_id
    if summary.results:  # the full split-protocol table: sortable in the UI, not hundreds of Markdown rows
        create_table_artifact([asdict(r) for r in summary.results], key=RESULTS_ARTIFACT,
                              description="every split-protocol row of this run: model, dataset, estimator, "
                                          "criterion, alpha, bound, search, FDR, coverage, fails")
    create_markdown_artifact(markdown_summary(summary), key="cic-pipeline",
                             description="what this run did: models × datasets, certified and unattainable cells, "
                                         "where the MLflow runs are, stage times")
    if summary.failed_models:
        failure = ModelsFailed(summary)
        return Failed(message=str(failure)[:2000], data=failure)
    return summary


def generation_key(settings: Any) -> dict[str, Any]:
    """What shapes a model's generations (the run key hashes it), as its engine says: the model (for a served
    model the identity its probe found, not the URLs: replicas and a moved server answer the same run), decoding
    settings, explicit dtype and quantization."""
    from cic.llm.engines import engine_class

    return engine_class(settings.engine).run_key(settings, settings.probe)


def plan_models(config: PipelineConfig, db_path: str, questions: dict[str, Any], summary: PipelineSummary,
                cluster: ray_pool.ClusterInfo, probes: dict[str, Any]) -> list[ModelJob]:
    """Register every (model, dataset) run and what it still lacks; one job per model, placed from its config.
    `probes`: what each model's engine probe found (its runs are keyed on it; its workers adopt it)."""
    from dataclasses import replace

    from cic.data import DATASETS
    from cic.llm.alignment import default_criteria

    jobs = []
    score_names = config.uncertainty.score_names(config.generation.adaptive)
    with Store.open(db_path, wait_s=60) as store:
        if config.storage.landing:  # what an earlier, killed run's workers landed is not answered again
            load_landing(store, config.storage.landing)
        for index, model in enumerate(config.models):
            settings = replace(config.answerer_settings(index), probe=probes[model.name])
            runs = []
            for dataset in config.datasets:
                frame = questions[dataset.name]
                prompt_id = DATASETS.prompt_for(dataset.name).prompt_id
                is_mc = frame.get_column("choices").is_not_null().any()
                criteria = tuple(dataset.criteria or default_criteria(bool(is_mc)))
                # the run key covers what shapes the generations only; scores are keyed by estimator name and
                # labels by criterion, so a new estimator or criterion re-scores stored answers (no LLM load)
                key = store.register_run(model.name, dataset.name, dataset.split, prompt_id,
                                         generation_key(settings),
                                         experiment_prefix=config.mlflow.experiment_prefix)
                summary.run_keys.append(key)
                work = missing_work(store, key, frame.get_column("question_id").to_list(),
                                    n_samples=config.generation.n_samples, estimators=score_names, criteria=criteria,
                                    adaptive=config.generation.adaptive)
                runs.append(RunJob(key, dataset.name, prompt_id, criteria, frame, work))
            share = model.max_failed_share
            try:
                placement = plan_placement(model, cluster, n_models=len(config.models),
                                           prefer_gpu=config.ray.prefer_gpu)
                jobs.append(ModelJob(model.name, settings, runs, model.replicas, placement, max_failed_share=share))
            except ray_pool.PlacementError as exc:  # this model cannot run here; the others still do
                jobs.append(ModelJob(model.name, settings, runs, model.replicas, None, error=str(exc)))
    return jobs


def run_stages(config: PipelineConfig, log_to_mlflow: bool, *, flow_run_id: str | None = None,
               probes: dict[str, dict[str, Any]] | None = None) -> PipelineSummary:
    """The pipeline's stages in order (the flow's body): questions → answer → probes → calibrate → report and
    log."""
    # every model's engine probed once before any work (a served model answers one token; a dead URL stops the run
    # here), unless `cic run` did it already: its runs are keyed on what the probe found, its workers adopt it
    found = probe_models(config, known={name: EngineProbe(**probe) for name, probe in (probes or {}).items()})
    for line in probe_lines(config, found):
        run_logger().info("%s", line)
    summary = PipelineSummary(db=config.storage.db, tracking_uri=tracking_uri(config.mlflow.tracking_uri),
                              report_dir=config.storage.report_dir, experiment_prefix=config.mlflow.experiment_prefix)
    seconds = summary.stage_seconds
    with timed(seconds, "total"):
        with timed(seconds, "questions"):
            questions = questions_stage(config)
        with timed(seconds, "answer"):
            jobs = answer_stage(config, questions, summary, found)
        failed = {s.model for s in summary.answer if s.error}
        finished = [r.run_key for job in jobs if job.model not in failed for r in job.runs]  # failed: partial data
        if finished:  # the report workers start (and import) on the core calibration leaves idle
            start_report_workers()
        try:
            if config.probes.kinds and finished:
                with timed(seconds, "probes"):
                    summary.probes = fit_probes(config.storage.db, finished, config.probes)
            with timed(seconds, "calibrate"):
                summary.calibrate = calibrate_runs(config.storage.db, finished, config.calibration)
            if finished:
                report_stage(config, finished, summary, log_to_mlflow, flow_run_id)
        finally:
            stop_report_workers()
    if finished:
        results_stage(config, finished, summary)
    return summary


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the stage's wall time to `seconds[stage]` (the summary's stage times, in the order stages end)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started


def questions_stage(config: PipelineConfig) -> dict[str, Any]:
    """Every dataset's questions, loaded and stored."""
    questions = {}
    for done, dataset in enumerate(config.datasets, 1):
        questions[dataset.name] = load_and_store_questions(config.storage.db, dataset)
        progress.report("questions", done, len(config.datasets))
    return questions


def answer_stage(config: PipelineConfig, questions: dict[str, Any], summary: PipelineSummary,
                 found: dict[str, Any]) -> list[ModelJob]:
    """Every model's missing answers on its Ray pool, all models at once; Ray is left once they are stored."""
    cluster = ray_pool.connect(config.ray.address_to_join(), num_cpus=config.ray.num_cpus,
                               runtime_env=config.ray.runtime_env)
    try:
        jobs = plan_models(config, config.storage.db, questions, summary, cluster, found)
        summary.answer = answer_questions(config.storage.db, jobs,
                                          questions_per_batch=config.generation.questions_per_batch,
                                          ready_timeout_s=config.ray.ready_timeout_s,
                                          batch_timeout_s=config.ray.batch_timeout_s,
                                          landing=config.storage.landing)
    finally:  # the answers are in DuckDB: leave Ray (an in-process one stops) while its processes still answer
        ray_pool.shutdown(cluster)
    return jobs


def report_stage(config: PipelineConfig, finished: list[str], summary: PipelineSummary, log_to_mlflow: bool,
                 flow_run_id: str | None) -> None:
    """Each group's report, logged to MLflow with it (or, without MLflow, written alone for `cic log` later); a
    tracking server that fails is a warning: the results are safe in DuckDB."""
    db, seconds = config.storage.db, summary.stage_seconds
    if not log_to_mlflow:
        with timed(seconds, "report"):
            summary.reports = len(write_group_reports(db, config.storage.report_dir, finished))
        with Store.open(db, read_only=True, wait_s=60) as store:
            summary.live = live_gate_ids(store, finished)
        if summary.live:
            summary.registry_error = "registry not updated (MLflow logging off) — run `cic gate sync` to register them"
        return
    started = time.perf_counter()
    try:
        summary.log = log_results(db, tracking=config.mlflow.tracking_uri,
                                  experiment_prefix=config.mlflow.experiment_prefix,
                                  report_dir=config.storage.report_dir, run_keys=finished, flow_run_id=flow_run_id)
    except Exception as exc:  # the results are safe in DuckDB; `cic log` fills MLflow in later
        summary.log_error = f"{type(exc).__name__}: {exc}"
        run_logger().warning("MLflow logging failed (%s); results are stored in %s, run `cic log` to log them",
                             summary.log_error, db)
    register_live(config, summary, finished)
    rendering = summary.log.report_s if summary.log else 0.0  # reports rendered while logging, as without MLflow:
    seconds["report"] = rendering                               # the rest of the stage is MLflow's
    seconds["log"] = time.perf_counter() - started - rendering


def register_live(config: PipelineConfig, summary: PipelineSummary, run_keys: list[str]) -> None:
    """The live gates of these runs get their registry versions and aliases (one home for "live": the store and
    the registry agree), also those a killed earlier run made live; idempotent. An unreachable registry is a
    warning that names `cic gate sync`."""
    with Store.open(config.storage.db, read_only=True, wait_s=60) as store:
        live = live_gate_ids(store, run_keys)
    summary.live = live
    if not live:
        return
    try:
        summary.registered = registry_sync(config.storage.db, summary.tracking_uri, live,
                                           experiment_prefix=config.mlflow.experiment_prefix)
    except Exception as exc:  # the store holds the live gates; the registry catches up with `cic gate sync`
        summary.registry_error = (f"registry not updated ({type(exc).__name__}: {exc}) — run `cic gate sync` once "
                                  "MLflow is back")
        run_logger().warning("%s", summary.registry_error)


def results_stage(config: PipelineConfig, finished: list[str], summary: PipelineSummary) -> None:
    """The run's results table (and the per-dataset table when gates are certified per dataset), from the store."""
    by_dataset = config.calibration.group_by == "dataset"
    with Store.open(config.storage.db, read_only=True, wait_s=60) as store:  # no write lock held
        summary.results = [ResultRow.from_row(r) for r in latest_results(store, finished).iter_rows(named=True)]
        summary.per_dataset = latest_group_results(store, finished).to_dicts() if by_dataset else []
        summary.systems = system_results(store, finished)
    if summary.per_dataset:
        summary.per_dataset_file = write_per_dataset(summary.per_dataset, config.storage.report_dir)
    elif by_dataset:
        summary.per_dataset_note = PER_DATASET_UNSHARED


def write_per_dataset(rows: list[dict[str, Any]], report_dir: str) -> str:
    """`<report_dir>/per_dataset.md` (and .csv): the per-dataset table; returns the Markdown file's path."""
    from pathlib import Path

    import polars as pl

    from cic.reports.tables import per_group_markdown
    from cic.store.outputs import guard_output_dir, write_frame, write_text

    out = Path(report_dir)
    guard_output_dir(out, "report_dir")
    out.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame(rows)
    write_frame(frame, out / "per_dataset.csv", "report_dir")
    write_text(out / "per_dataset.md", "# Per dataset: per-dataset gates (δ / G each) beside the pooled gate\n\n"
               + per_group_markdown(frame), "report_dir")
    return str(out / "per_dataset.md")
