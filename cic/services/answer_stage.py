"""The answer stage's work, behind the thin `answer` task: every model's unfinished questions sharded into
batches, one Ray pool of replicas per model, all at once, and each batch stored as it lands.

Workers return Arrow batches; this runs in the flow's process, the only DuckDB writer, and stores a batch's
generations, scores and labels in one transaction, so a crash or kill loses at most the batches in flight
and a rerun picks up exactly what is missing (`cic.store.resume`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import polars as pl

from cic.errors import UserError
from cic.llm.answering import AnswererSettings
from cic.llm.uncertainty.estimators import DATA_NEEDS, get_estimator, unmet_by
from cic.pipeline.run import progress
from cic.pipeline.run.run_results import AnswerStats
from cic.services import ray_pool
from cic.services.answer_worker import RayAnswerWorker
from cic.store import Store
from cic.store.landing import load_landing
from cic.store.resume import RunWork, stored_generations

#: How long a batch write waits for another process to release the store before the task fails.
WRITE_WAIT_S = 300.0


@dataclass(frozen=True)
class RunJob:
    """One (model, dataset) run: its key, its questions, what is missing and how to label it."""

    run_key: str
    dataset: str
    prompt_id: str
    criteria: tuple[str, ...]
    questions: pl.DataFrame
    work: RunWork


def make_jobs(store: Store, runs: list[RunJob], questions_per_batch: int,
              landing: str | None = None) -> list[dict[str, Any]]:
    """Shard every run's unfinished questions into batches for the workers (who append them to `landing`, a
    Delta table, where given)."""
    jobs = []
    for run in runs:
        for ids, generate in ((run.work.to_generate, True), (run.work.to_score, False)):
            for start in range(0, len(ids), questions_per_batch):
                chunk = ids[start:start + questions_per_batch]
                batch = run.questions.filter(pl.col("question_id").is_in(chunk))
                stored = None if generate else stored_generations(store, run.run_key, chunk).to_arrow()
                jobs.append({"batch_id": len(jobs), "run_key": run.run_key, "criteria": list(run.criteria),
                             "prompt_id": run.prompt_id, "questions": batch.to_arrow(), "generations": stored,
                             "landing": landing})
    return jobs


def store_batch(store: Store, result: dict[str, Any], landing: str | None = None) -> None:
    """Write one worker batch atomically: all three tables or nothing; a batch the worker appended to the
    landing table is loaded from there, with whatever else landed (`cic.store.landing`)."""
    if result.get("landed") is not None and landing:
        loaded = load_landing(store, landing)
        if loaded.version < int(result["landed"]):  # the worker's table is not the one the flow reads
            raise UserError(f"storage.landing = {landing!r}: a worker committed version {result['landed']} but this "
                            f"process sees {'no table' if loaded.version < 0 else f'version {loaded.version}'} "
                            "there; give a path every Ray node shares (a shared disk) or an object store URI")
        return
    with store.transaction():
        store.upsert("generations", result["generations"])
        store.upsert("scores", result["scores"])
        store.upsert("labels", result["labels"])


WORDS = {"token_logprobs": "token log-probabilities", "option_probs": "option probabilities"}


@dataclass(frozen=True)
class ModelJob:
    """One model's share of the answer stage: its worker settings, runs, replicas and placement."""

    model: str
    settings: AnswererSettings
    runs: list[RunJob]
    replicas: int
    placement: ray_pool.Placement | None
    error: str | None = None  # known before starting (e.g. a GPU the in-process Ray lacks): reported, not run
    max_failed_share: float = 0.0  # a served model: the share of questions that may go unanswered


def record_unanswered(db: str, models: list[ModelJob], moved: dict[str, int]) -> None:
    """Store, per run, how many of its questions are still unanswered and how many of its requests moved to
    another replica in this answer stage (MLflow logs them as `unanswered_questions`, `moved_requests`)."""
    with Store.open(db, wait_s=WRITE_WAIT_S) as store:
        for m in models:
            for run in m.runs:
                store.set_unanswered(run.run_key, run.questions.get_column("question_id").cast(str).to_list(),
                                     moved=moved.get(run.run_key, 0))


def plan_placement(model: Any, cluster: ray_pool.ClusterInfo, *, n_models: int, prefer_gpu: bool = True) -> \
    ray_pool.Placement:
    """A model's replica request from its config (`gpus_per_replica`, `allow_cpu_fallback`) and its engine;
    CPU replicas share the cluster's CPUs among every model's replicas."""
    from cic.llm.engines import engine_class

    cpu_share = max(1.0, float(cluster.cpus // max(1, n_models * model.replicas)))
    gpus = engine_class(model.kind).gpus(model.gpus_per_replica)  # a served model's GPUs are its server's
    return ray_pool.resolve_placement(model.name, gpus, cluster, cpus_per_cpu_actor=cpu_share,
                                         allow_cpu_fallback=model.allow_cpu_fallback, prefer_gpu=prefer_gpu,
                                         resources=model.resources)


def answer_all(db: str, models: list[ModelJob], *, questions_per_batch: int, ready_timeout_s: float,
               batch_timeout_s: float, logger: logging.Logger | logging.LoggerAdapter,
               landing: str | None = None) -> list[AnswerStats]:
    """Generate → score → label every unfinished question of every model at once; a model that fails is reported
    in its stats (`error`), the others finish. Call inside `ray_pool.connect` (the flow does). With `landing`,
    workers append their batches to that Delta table and the flow loads them from it."""
    started = time.perf_counter()
    stats = {m.model: AnswerStats(model=m.model) for m in models}
    jobs = plan_batches(db, models, stats, questions_per_batch, landing)
    pools = [pool for m in models if (pool := start_pool(m, jobs[m.model], stats[m.model], ready_timeout_s,
                                                         logger)) is not None]
    moved: dict[str, int] = {}
    done, first = store_as_they_land(db, pools, jobs, stats, started, batch_timeout_s, moved, landing)
    record_unanswered(db, models, moved)
    for pool in pools:
        job = next(m for m in models if m.model == pool.name)
        judge(pool, job, stats[pool.name], done[pool.name], first.get(pool.name, 0.0), started, logger)
    return [stats[m.model] for m in models]


def plan_batches(db: str, models: list[ModelJob], stats: dict[str, AnswerStats],
                 questions_per_batch: int, landing: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every model's batches, read from the store in one pass; each model's question count in its stats."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    with Store.open(db, read_only=True, wait_s=WRITE_WAIT_S) as store:
        for m in models:
            jobs[m.model] = make_jobs(store, m.runs, questions_per_batch, landing)
            stats[m.model].questions = sum(j["questions"].num_rows for j in jobs[m.model])
    return jobs


def start_pool(m: ModelJob, jobs: list[dict[str, Any]], item: AnswerStats, ready_timeout_s: float,
               logger: logging.Logger | logging.LoggerAdapter) -> ray_pool.WorkerPool | None:
    """The model's pool of replicas (the LLM loaded only where some batch generates), or None: nothing to do, or
    a model that cannot start (named in its stats and the log)."""
    if m.error is not None or m.placement is None:
        item.error = m.error or "no placement"
        logger.error("%s FAILED before starting: %s", m.model, item.error)
        return None
    if not jobs:
        progress.report(f"answer {m.model}", 0, 0)
        return None
    needs_llm = any(j["generations"] is None for j in jobs)
    # said before the replicas load (a model's first batch can be minutes away); repeated while it is quiet
    progress.report(f"answer {m.model}", 0, item.questions)
    pool = ray_pool.WorkerPool(m.model, RayAnswerWorker, (m.settings, needs_llm),
                               n_actors=max(1, min(m.replicas, len(jobs))), placement=m.placement,
                               ready_timeout_s=ready_timeout_s)
    item.actors, item.options, item.llm_loaded = pool.n_actors, pool.options, needs_llm
    return pool


def store_as_they_land(db: str, pools: list[ray_pool.WorkerPool], jobs: dict[str, list[dict[str, Any]]],
                       stats: dict[str, AnswerStats], started: float, batch_timeout_s: float,
                       moved: dict[str, int], landing: str | None = None) -> tuple[dict[str, int], dict[str, float]]:
    """Drain every pool at once, storing each batch as it lands; returns questions done and the seconds to each
    model's first batch; `moved` gathers, per run, the requests handed to another replica."""
    done = {pool.name: 0 for pool in pools}
    first: dict[str, float] = {}
    for pool, _, result in ray_pool.drain_pools(pools, {p.name: jobs[p.name] for p in pools}, "process",
                                                batch_timeout_s=batch_timeout_s):
        item = stats[pool.name]
        first.setdefault(pool.name, time.perf_counter() - started)
        # the file is held only while one batch is written: readers (cic ask, a calibration, the nightly
        # recalibration) get it between batches, and a reader holding it makes this wait, not fail
        with Store.open(db, wait_s=WRITE_WAIT_S) as store:
            store_batch(store, result, landing)
        done[pool.name] += int(result["stats"]["questions"])
        item.failed += len(result.get("failures") or {})
        item.failure = item.failure or next(iter((result.get("failures") or {}).values()), None)
        item.generated += int(result["stats"]["generated_questions"])
        item.tokens += int(result["stats"].get("generated_tokens", 0))
        item.generations += int(result["stats"].get("generations", 0))
        item.moved += int(result["stats"].get("moved_requests", 0))
        if result.get("run_key"):
            moved[result["run_key"]] = moved.get(result["run_key"], 0) + int(result["stats"].get("moved_requests", 0))
        item.batches += 1
        progress.report(f"answer {pool.name}", done[pool.name], item.questions)
    return done, first


def _source(job: ModelJob) -> str:
    """What answers the model, as its failure lines name it: the endpoint, or the engine the config names."""
    return "the endpoint" if job.settings.engine == "endpoint" else f"its engine ({job.settings.engine})"


def _share_field(job: ModelJob) -> str:
    """The setting that allows unanswered questions: `endpoint.max_failed_share` or the engine's options'."""
    return "endpoint.max_failed_share" if job.settings.engine == "endpoint" else "options.max_failed_share"


def judge(pool: ray_pool.WorkerPool, job: ModelJob, item: AnswerStats, done: int, first_s: float, started: float,
          logger: logging.Logger | logging.LoggerAdapter) -> None:
    """A model's verdict once its pool is drained: failed (an error, or more unanswered questions than its
    `max_failed_share`), finished with losses (a warning), or finished; and what its server could not give."""
    item.options, item.error, item.nodes = pool.options, pool.error, list(pool.placed_on)
    item.load_s, item.wall_s = first_s, time.perf_counter() - started
    if "offers" in pool.info and (unread := unmet_by(job.settings.estimators, set(pool.info["offers"]))):
        lacking = [WORDS[n] for n in DATA_NEEDS if n not in pool.info["offers"]
                   and any(n in get_estimator(e).data_needs for e in unread)]
        logger.warning("%s: the server returns no %s, so %s store null and are not calibrated", pool.name,
                       " or ".join(lacking), ", ".join(unread))
    if not item.error and item.failed and item.failed > job.max_failed_share * item.questions:
        item.error = (f"{item.failed} of {item.questions} questions got no answer from {_source(job)} (more than "
                      f"{_share_field(job)} = {job.max_failed_share:g}); first: {item.failure}; the answers "
                      "it gave are stored, a rerun asks only the others")
    if item.error:
        logger.error("%s FAILED after %d of %d questions: %s", pool.name, done, item.questions, item.error)
    elif item.failed:  # within its max_failed_share: the run goes on, and says what it lost
        logger.warning("%s: %d of %d questions got no answer from %s (within %s = %g); first: %s; a rerun asks "
                       "only them", pool.name, item.failed, item.questions, _source(job), _share_field(job),
                       job.max_failed_share, item.failure)
    if item.moved:  # a replica stopped answering: its requests were answered by the others
        logger.warning("%s: %d request(s) moved to another replica after theirs stopped answering (answered there; "
                       "the replica's reason is in the services log)", pool.name, item.moved)
    if not item.error:
        logger.info("%s: %d questions (%d generated, %.2f generations a question, %d tokens) in %d batches on %d "
                    "actor(s) %s, %.1f s", pool.name, item.questions, item.generated, item.generations_per_question,
                    item.tokens, item.batches, item.actors, item.options, item.wall_s)
