"""The demo main job end to end, then generation throughput with 1 and 2 Ray actors in the same run.

    .venv/bin/python benchmarks/bench_pipeline.py [--config demo] [--questions 30]

Prints the wall time of every stage of `cic run` on the demo config (fresh DuckDB and MLflow in a temp
dir; the converted-model cache is reused, as after install), checks the 5-minute target, then answers the
same TriviaQA questions with one actor and with two (one CPU each) and prints questions/s and the ratio.
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
    for stage, seconds in summary["stage_seconds"].items():
        print(f"  {stage:<28} {seconds:8.1f} s")
    print(f"  {'wall (incl. Prefect start)':<28} {total:8.1f} s   target <= {TARGET_S:.0f} s: "
          f"{'met' if total <= TARGET_S else 'NOT met'}")
    for stats in summary["answer"]:
        print(f"  answered {stats['questions']} questions ({stats['generated']} generated) on {stats['actors']} "
              f"actor(s); model load {stats['load_s']:.1f} s")
    return total


def throughput(config: Path, work: Path, n_questions: int, replicas: int) -> float:
    """Questions/s of the answer stage (model load excluded) with `replicas` actors on fresh storage."""
    from cic.data import DATASETS, load_questions
    from cic.pipeline.config import load_config
    from cic.store import Store
    from cic.store.resume import RunWork
    from tasks.answer import RunJob, answer_questions

    cfg = load_config(config)
    questions = load_questions("trivia_qa", limit=n_questions, seed=1)
    db = str(work / f"throughput_{replicas}.duckdb")
    with Store.open(db) as store:
        store.upsert("questions", questions)
    ids = questions.get_column("question_id").to_list()
    job = RunJob(f"bench-{replicas}", "trivia_qa", DATASETS.prompt_for("trivia_qa").prompt_id, ("similarity[0.6]",),
                 questions, RunWork(f"bench-{replicas}", ids, []))
    stats = answer_questions.fn(db, "bench", cfg.answerer_settings(0), [job], replicas=replicas,
                                questions_per_batch=max(1, n_questions // (2 * replicas)), num_cpus=2)
    return stats.questions_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="demo")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    from tasks import ray_workers

    with tempfile.TemporaryDirectory(prefix="cic-bench-") as tmp:
        work = Path(tmp)
        info = ray_workers.connect(num_cpus=2)
        try:
            if not args.skip_demo:
                demo(args.config, work)
            one = throughput(args.config, work, args.questions, 1)
            two = throughput(args.config, work, args.questions, 2)
        finally:
            ray_workers.shutdown(info)
    print(f"generation + scoring throughput on {args.questions} TriviaQA questions (model load excluded):")
    print(f"  1 actor : {one:6.2f} questions/s")
    print(f"  2 actors: {two:6.2f} questions/s   ratio 2/1 = {two / one if one else float('nan'):.2f}x "
          "(one actor runs torch on every CPU of the node; two split them, one each)")


if __name__ == "__main__":
    main()
