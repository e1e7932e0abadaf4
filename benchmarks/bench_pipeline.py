"""The demo main job end to end; two models answered at once vs one after the other; 1 vs 2 actors of one
model — all in the same run.

    .venv/bin/python benchmarks/bench_pipeline.py [--config demo] [--questions 30] [--skip-demo]

Prints the wall time of every stage of `cic run` on the demo config (fresh DuckDB and MLflow in a temp
dir; the converted-model cache is reused, as after install) and checks the 5-minute target; then two models
(the config's model under two names) × two datasets, both pools drained at once on one CPU each vs one model
after the other on both CPUs; then the same TriviaQA questions with one actor and with two.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
TARGET_S = 300.0


def demo(config: Path, work: Path) -> float:
    from flows.pipeline import pipeline

    started = time.perf_counter()
    summary = pipeline(config_path=str(config), db=str(work / "demo.duckdb"), report_dir=str(work / "reports"),
                       tracking=f"sqlite:///{work}/mlflow.db")
    total = time.perf_counter() - started
    print("demo main job (fresh DuckDB + MLflow, Prefect ephemeral API and Ray started in-process):")
    for stage, seconds in summary.stage_seconds.items():
        print(f"  {stage:<28} {seconds:8.1f} s")
    print(f"  {'wall (incl. Prefect start)':<28} {total:8.1f} s   target <= {TARGET_S:.0f} s: "
          f"{'met' if total <= TARGET_S else 'NOT met'}")
    for stats in summary.answer:
        print(f"  answered {stats.questions} questions ({stats.generated} generated) on {stats.actors} "
              f"actor(s); model load {stats.load_s:.1f} s")
    return total


def _run_job(cfg: object, name: str, questions: dict[str, object], db: str) -> list[object]:
    """One model's RunJobs over the datasets, every question still to generate."""
    from cic.data import DATASETS
    from cic.services.answer_stage import RunJob
    from cic.store import Store
    from cic.store.resume import RunWork

    runs = []
    with Store.open(db) as store:
        for dataset, frame in questions.items():
            store.upsert("questions", frame)
            ids = frame.get_column("question_id").to_list()
            criteria = ("option_match",) if dataset == "commonsense_qa" else ("similarity[0.6]",)
            key = f"bench-{name}-{dataset}"
            runs.append(RunJob(key, dataset, DATASETS.prompt_for(dataset).prompt_id, criteria, frame,
                               RunWork(key, ids, [])))
    return runs


def answer(cfg: object, db: str, models: list[tuple[str, int, float]], questions: dict[str, object],
           per_batch: int) -> tuple[float, list[object]]:
    """Wall seconds of one answer stage over `models` = (name, replicas, CPUs per replica), model load included."""
    from cic.services.answer_stage import ModelJob
    from cic.services.ray_pool import Placement
    from tasks.answer import answer_questions

    jobs = [ModelJob(name, cfg.answerer_settings(0), _run_job(cfg, name, questions, db), replicas,
                     Placement(0.0, cpus)) for name, replicas, cpus in models]
    started = time.perf_counter()
    stats = answer_questions.fn(db, jobs, questions_per_batch=per_batch)
    return time.perf_counter() - started, stats


def throughput(cfg: object, work: Path, n_questions: int, replicas: int) -> float:
    """Questions/s of one model's answer stage with `replicas` actors (2 CPUs shared) on fresh storage."""
    from cic.data import load_questions

    questions = {"trivia_qa": load_questions("trivia_qa", limit=n_questions, seed=1)}
    _, stats = answer(cfg, str(work / f"throughput_{replicas}.duckdb"), [("bench", replicas, 2.0 / replicas)],
                      questions, max(1, n_questions // (2 * replicas)))
    return stats[0].questions_per_s


def models_at_once(cfg: object, work: Path, n_questions: int) -> tuple[float, float]:
    """Two models × two datasets: both models at once on one CPU each, vs one model after the other on both
    CPUs (what the pipeline did before). Returns (concurrent, sequential) wall seconds, model loads included."""
    from cic.data import load_questions

    questions = {d: load_questions(d, limit=n_questions, seed=1) for d in ("commonsense_qa", "trivia_qa")}
    per_batch = max(1, n_questions // 2)
    together, stats = answer(cfg, str(work / "together.duckdb"), [("model-a", 1, 1.0), ("model-b", 1, 1.0)],
                             questions, per_batch)
    assert not any(s.error for s in stats), [s.error for s in stats]
    apart = sum(answer(cfg, str(work / f"apart-{name}.duckdb"), [(name, 1, 2.0)], questions, per_batch)[0]
                for name in ("model-a", "model-b"))
    return together, apart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="demo")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    from cic.pipeline.config import load_config
    from cic.services import ray_pool

    with tempfile.TemporaryDirectory(prefix="cic-bench-") as tmp:
        work = Path(tmp)
        info = ray_pool.connect(num_cpus=2)
        try:
            if not args.skip_demo:
                demo(args.config, work)
            cfg = load_config(args.config)
            together, apart = models_at_once(cfg, work, args.questions // 2)
            one = throughput(cfg, work, args.questions, 1)
            two = throughput(cfg, work, args.questions, 2)
        finally:
            ray_pool.shutdown(info)
    print(f"two models x two datasets ({args.questions // 2} CommonsenseQA + {args.questions // 2} TriviaQA questions "
          "each), model loads included:")
    print(f"  both models at once, one CPU each     : {together:6.1f} s")
    print(f"  one model after the other, both CPUs  : {apart:6.1f} s   ratio sequential/concurrent = "
          f"{apart / together:.2f}x")
    print(f"generation + scoring throughput on {args.questions} TriviaQA questions (model load excluded):")
    print(f"  1 actor : {one:6.2f} questions/s")
    print(f"  2 actors: {two:6.2f} questions/s   ratio 2/1 = {two / one if one else float('nan'):.2f}x "
          "(one actor runs torch on every CPU of the node; two split them, one each)")


if __name__ == "__main__":
    main()
