"""The answer stage of a config (generate, score, label), this checkout against an earlier commit, same run.

    .venv/bin/python benchmarks/bench_answer_stage.py [--config demo] [--against 822c24d]

Each side runs in its own process on the same machine, one after the other: the earlier commit is checked
out with `git worktree` into a temp dir and imported from there (same virtual environment). Both load the
config's first model once (not timed), then answer every dataset of the config in batches of
`questions_per_batch`, as one pipeline worker does, and report questions/s. Nothing is stored.
822c24d is the last commit before generation moved onto the device (issue 12).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time
from cic.data import DATASETS, load_questions
from cic.llm.alignment import default_criteria
from cic.llm.answering import Answerer
from cic.pipeline.config import load_config
from tasks.questions import source_argument

config = load_config(sys.argv[1])
answerer = Answerer(config.answerer_settings(0))
per_batch = config.generation.questions_per_batch
timings = {}
for dataset in config.datasets:
    frame = load_questions(dataset.name, source_argument(dataset.source), split=dataset.split,
                           limit=dataset.limit, seed=dataset.seed)
    is_mc = frame.get_column("choices").is_not_null().any()
    criteria = tuple(dataset.criteria or default_criteria(bool(is_mc)))
    prompt_id = DATASETS.prompt_for(dataset.name).prompt_id
    started, generate_s = time.perf_counter(), 0.0
    for start in range(0, frame.height, per_batch):
        batch = answerer.process(frame[start:start + per_batch], run_key="bench", criteria=criteria,
                                 prompt_id=prompt_id)
        generate_s += batch.stats["generate_s"]
    timings[dataset.name] = [frame.height, time.perf_counter() - started, generate_s]
print("RESULT " + json.dumps(timings))
"""


def run_side(checkout: Path, config: str) -> dict[str, list[float]]:
    """Questions and seconds per dataset, answered by the code in `checkout`."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", WORKER, config], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"answer stage in {checkout} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="demo")
    parser.add_argument("--against", default="822c24d", help="the earlier commit to compare with")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="cic-baseline-") as tmp:
        baseline = Path(tmp) / "checkout"
        subprocess.run(["git", "worktree", "add", "--detach", str(baseline), args.against], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            before = run_side(baseline, args.config)
            after = run_side(ROOT, args.config)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, capture_output=True)
    print(f"answer stage of config {args.config!r} (model load excluded), {args.against} vs this checkout "
          f"({head}), same machine, same run:")
    totals = {"before": [0.0, 0.0], "after": [0.0, 0.0]}
    for name in after:
        for side, result in (("before", before), ("after", after)):
            totals[side][0] += result[name][0]
            totals[side][1] += result[name][1]
        b, a = before[name], after[name]
        print(f"  {name:<16} {int(a[0]):5d} questions: {b[0] / b[1]:6.2f} -> {a[0] / a[1]:6.2f} questions/s "
              f"({b[1] / a[1]:.2f}x); generating {b[2]:.1f} s -> {a[2]:.1f} s, scoring and labelling "
              f"{b[1] - b[2]:.1f} s -> {a[1] - a[2]:.1f} s")
    b, a = totals["before"], totals["after"]
    print(f"  {'all':<16} {int(a[0]):5d} questions: {b[0] / b[1]:6.2f} -> {a[0] / a[1]:6.2f} questions/s "
          f"({b[1] / a[1]:.2f}x; target >= 2x)")


if __name__ == "__main__":
    main()
