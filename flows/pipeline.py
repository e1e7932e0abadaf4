"""The main job: for every model × dataset, generate → score → label → store, then calibrate, evaluate, log.

    questions ──► answer (Ray actors, one per model replica) ──► DuckDB ──► calibrate + split protocol ──► MLflow

Work already in DuckDB is not redone: each run's unfinished questions are computed from the store
(`cic.store.resume`), so a rerun adds nothing and a killed run resumes where it stopped.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect import flow

from cic.pipeline import progress
from cic.pipeline.config import PipelineConfig, load_config
from cic.pipeline.progress import ProgressLines
from cic.store import Store
from cic.store.resume import missing_work
from tasks.answer import AnswerStats, RunJob, answer_questions
from tasks.calibrate import CalibrateStats, calibrate_runs
from tasks.log import LogStats, log_results, tracking_uri
from tasks.questions import load_and_store_questions

log = logging.getLogger("cic.pipeline")
DEMO_CONFIG = "demo"  # the config shipped in cic/pipeline/configs/demo.yaml


@dataclass
class PipelineSummary:
    """What one pipeline run did, stage by stage."""

    db: str
    tracking_uri: str
    report_dir: str
    run_keys: list[str] = field(default_factory=list)
    answer: list[AnswerStats] = field(default_factory=list)
    calibrate: CalibrateStats | None = None
    log: LogStats | None = None
    log_error: str | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def with_overrides(config: PipelineConfig, db: str | None, ray_address: str | None, tracking: str | None,
                   report_dir: str | None) -> PipelineConfig:
    """Command-line / deployment overrides of the config's service settings."""
    storage = config.storage.model_copy(update={k: v for k, v in (("db", db), ("report_dir", report_dir)) if v})
    ray = config.ray.model_copy(update={"address": ray_address} if ray_address else {})
    mlflow = config.mlflow.model_copy(update={"tracking_uri": tracking} if tracking else {})
    return config.model_copy(update={"storage": storage, "ray": ray, "mlflow": mlflow})


@flow(name="cic-pipeline", log_prints=True)
def pipeline(config_path: str = DEMO_CONFIG, db: str | None = None, ray_address: str | None = None,
             tracking: str | None = None, report_dir: str | None = None, log_to_mlflow: bool = True) -> dict[str, Any]:
    """Run the whole job for the config; returns a summary (also the flow run's result).

    Stage progress goes to the flow run's log (the Prefect UI, a worker's output) at least every 30 s while a
    stage runs, whoever started the flow: `cic run`, a deployment's schedule or plain Python.
    """
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    with ProgressLines(get_run_logger().info):
        summary = run_stages(config_path, db, ray_address, tracking, report_dir, log_to_mlflow)
    summary["flow_run_id"] = str(flow_run.id) if flow_run.id else None
    return summary


def run_stages(config_path: str, db: str | None, ray_address: str | None, tracking: str | None,
               report_dir: str | None, log_to_mlflow: bool) -> dict[str, Any]:
    """The pipeline's stages in order (the flow's body)."""
    import time

    from cic.data import DATASETS
    from cic.llm.alignment import default_criteria

    config = with_overrides(load_config(config_path), db, ray_address, tracking, report_dir)
    db_path = config.storage.db
    summary = PipelineSummary(db=db_path, tracking_uri=tracking_uri(config.mlflow.tracking_uri),
                              report_dir=config.storage.report_dir)
    started = time.perf_counter()
    questions = {}
    for done, dataset in enumerate(config.datasets, 1):
        questions[dataset.name] = load_and_store_questions(db_path, dataset)
        progress.report("questions", done, len(config.datasets))
    summary.stage_seconds["questions"] = time.perf_counter() - started

    gen = config.generation
    for index, model in enumerate(config.models):
        settings = config.answerer_settings(index)
        runs = []
        with Store.open(db_path, wait_s=60) as store:
            for dataset in config.datasets:
                frame = questions[dataset.name]
                prompt_id = DATASETS.prompt_for(dataset.name).prompt_id
                is_mc = frame.get_column("choices").is_not_null().any()
                criteria = tuple(dataset.criteria or default_criteria(bool(is_mc)))
                key = store.register_run(model.name, dataset.name, dataset.split, prompt_id, {
                    "model_spec": model.spec, **settings.generation.shaping(),
                    # numerics shape the answers: an explicit dtype is its own run ("auto" keeps older keys)
                    **({"dtype": model.dtype} if model.dtype != "auto" else {}),
                    "estimators": list(config.uncertainty.estimators), "equivalence": config.uncertainty.equivalence,
                    "embedding_model": config.uncertainty.embedding_model,
                    "embedding_threshold": config.uncertainty.embedding_threshold,
                    "nli_model": config.uncertainty.nli_model, "nli_variant": config.uncertainty.nli_variant},
                    experiment_prefix=config.mlflow.experiment_prefix)
                summary.run_keys.append(key)
                work = missing_work(store, key, frame.get_column("question_id").to_list(), n_samples=gen.n_samples,
                                    n_estimators=len(config.uncertainty.estimators), criteria=criteria)
                runs.append(RunJob(key, dataset.name, prompt_id, criteria, frame, work))
        stage = time.perf_counter()
        summary.answer.append(answer_questions(
            db_path, model.name, settings, runs, replicas=model.replicas, questions_per_batch=gen.questions_per_batch,
            ray_address=config.ray.address, prefer_gpu=config.ray.prefer_gpu, num_cpus=config.ray.num_cpus,
            ready_timeout_s=config.ray.ready_timeout_s))
        summary.stage_seconds[f"answer {model.name}"] = time.perf_counter() - stage

    stage = time.perf_counter()
    summary.calibrate = calibrate_runs(db_path, summary.run_keys, config.calibration)
    summary.stage_seconds["calibrate"] = time.perf_counter() - stage
    if log_to_mlflow:
        stage = time.perf_counter()
        try:
            summary.log = log_results(db_path, tracking=config.mlflow.tracking_uri,
                                      experiment_prefix=config.mlflow.experiment_prefix,
                                      report_dir=config.storage.report_dir, run_keys=summary.run_keys)
        except Exception as exc:  # the results are safe in DuckDB; `cic log` fills MLflow in later
            summary.log_error = f"{type(exc).__name__}: {exc}"
            log.warning("MLflow logging failed (%s); results are stored in %s, run `cic log` to log them",
                        summary.log_error, db_path)
        summary.stage_seconds["log"] = time.perf_counter() - stage
    summary.stage_seconds["total"] = time.perf_counter() - started
    return summary.as_dict()
