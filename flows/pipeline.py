"""The main job: every model × dataset at once, generate → score → label → store, then calibrate, evaluate, log.

    questions ──► answer (a Ray pool per model, all at once) ──► DuckDB ──► calibrate + split protocol ──► MLflow

A model that fails (cannot be placed, cannot load, keeps failing batches) is reported with its error while the
others finish, are calibrated and logged; the run then ends Failed naming it, and a rerun retries only it.

Work already in DuckDB is not redone: each run's unfinished questions are computed from the store
(`cic.store.resume`), so a rerun adds nothing and a killed run resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow
from prefect.states import Failed, State

from cic.llm.engines import EngineProbe
from cic.pipeline import progress
from cic.pipeline.config import DEMO_CONFIG, PipelineConfig, flow_config
from cic.pipeline.group_reports import write_group_reports
from cic.pipeline.preflight import probe_models
from cic.pipeline.progress import ProgressLines
from cic.pipeline.run_digest import PER_DATASET_UNSHARED, RESULTS_ARTIFACT, markdown_summary
from cic.pipeline.run_results import PipelineSummary, ResultRow
from cic.services import ray_pool
from cic.services.mlflow_tracking import tracking_uri
from cic.services.prefect_limits import store_slot
from cic.services.prefect_runs import flow_run_name, run_logger
from cic.store import Store
from cic.store.queries import latest_group_results, latest_results
from cic.store.resume import missing_work
from tasks.answer import ModelJob, RunJob, answer_questions, plan_placement
from tasks.calibrate import calibrate_runs
from tasks.log import log_results
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
             config: PipelineConfig | None = None) -> PipelineSummary | State:
    """Run the whole job for the config; returns a summary (also the flow run's result).

    Stage progress goes to the flow run's log (the Prefect UI, a worker's output) at least every 30 s while a
    stage runs, whoever started the flow: `cic run`, a deployment's schedule or plain Python. When a model
    fails, the run ends Failed (a direct call raises `ModelsFailed`; `return_state=True` returns the state,
    whose result is that exception with its `.summary`). `probes`: what `cic run` already found when it probed
    every model's engine (model -> identity and state); the flow probes them itself otherwise, once. `config`:
    the config `cic run` already parsed from `config_path` (a deployment passes the path alone).
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
    score_names = config.uncertainty.score_names()
    with Store.open(db_path, wait_s=60) as store:
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
                                    n_samples=config.generation.n_samples, estimators=score_names, criteria=criteria)
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
    """The pipeline's stages in order (the flow's body)."""
    import time

    db_path = config.storage.db
    # every model's engine probed once before any work (a served model answers one token; a dead URL stops the run
    # here), unless `cic run` did it already: its runs are keyed on what the probe found, its workers adopt it
    found = probe_models(config, known={name: EngineProbe(**probe) for name, probe in (probes or {}).items()})
    summary = PipelineSummary(db=db_path, tracking_uri=tracking_uri(config.mlflow.tracking_uri),
                              report_dir=config.storage.report_dir, experiment_prefix=config.mlflow.experiment_prefix)
    started = time.perf_counter()
    questions = {}
    for done, dataset in enumerate(config.datasets, 1):
        questions[dataset.name] = load_and_store_questions(db_path, dataset)
        progress.report("questions", done, len(config.datasets))
    summary.stage_seconds["questions"] = time.perf_counter() - started

    stage = time.perf_counter()
    cluster = ray_pool.connect(config.ray.address, num_cpus=config.ray.num_cpus,
                                  runtime_env=config.ray.runtime_env)
    try:
        jobs = plan_models(config, db_path, questions, summary, cluster, found)
        summary.answer = answer_questions(db_path, jobs, questions_per_batch=config.generation.questions_per_batch,
                                          ready_timeout_s=config.ray.ready_timeout_s,
                                          batch_timeout_s=config.ray.batch_timeout_s)
    finally:  # the answers are in DuckDB: leave Ray (an in-process one stops) while its processes still answer
        ray_pool.shutdown(cluster)
    summary.stage_seconds["answer"] = time.perf_counter() - stage
    failed = {s.model for s in summary.answer if s.error}
    finished = [r.run_key for job in jobs if job.model not in failed for r in job.runs]  # failed: partial data

    stage = time.perf_counter()
    summary.calibrate = calibrate_runs(db_path, finished, config.calibration)
    summary.stage_seconds["calibrate"] = time.perf_counter() - stage
    if log_to_mlflow and finished:
        stage = time.perf_counter()
        try:
            summary.log = log_results(db_path, tracking=config.mlflow.tracking_uri,
                                      experiment_prefix=config.mlflow.experiment_prefix,
                                      report_dir=config.storage.report_dir, run_keys=finished,
                                      flow_run_id=flow_run_id)
        except Exception as exc:  # the results are safe in DuckDB; `cic log` fills MLflow in later
            summary.log_error = f"{type(exc).__name__}: {exc}"
            run_logger().warning("MLflow logging failed (%s); results are stored in %s, run `cic log` to log them",
                                 summary.log_error, db_path)
        rendering = summary.log.report_s if summary.log else 0.0  # reports rendered while logging (as without
        summary.stage_seconds["report"] = rendering                 # MLflow), the rest of the stage is MLflow's
        summary.stage_seconds["log"] = time.perf_counter() - stage - rendering
    elif finished:  # no MLflow this time: the same report directories, for `cic log` to attach later
        stage = time.perf_counter()
        summary.reports = len(write_group_reports(db_path, config.storage.report_dir, finished))
        summary.stage_seconds["report"] = time.perf_counter() - stage
    summary.stage_seconds["total"] = time.perf_counter() - started
    by_dataset = config.calibration.group_by == "dataset"
    if finished:  # read without holding a write lock
        with Store.open(db_path, read_only=True, wait_s=60) as store:
            summary.results = [ResultRow.from_row(r) for r in latest_results(store, finished).iter_rows(named=True)]
            summary.per_dataset = latest_group_results(store, finished).to_dicts() if by_dataset else []
    if summary.per_dataset:
        summary.per_dataset_file = write_per_dataset(summary.per_dataset, config.storage.report_dir)
    elif by_dataset and finished:
        summary.per_dataset_note = PER_DATASET_UNSHARED
    return summary


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
