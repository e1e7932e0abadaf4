"""Plug-ins from another package: a tiny package built here and installed with pip into a folder of its own adds a
bound, a search, an estimator and the statistic it reads, an engine, a harness, a drift test and its alert kind by
entry points, and the installed `cic` (`calibrate`, `convert`, `run`) uses them without CIC being edited
(`cic.registry`). The engine is `tests/support/replay_engine.py`, packaged as a third party's module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import cic
from cic.errors import UserError
from cic.registry import Registry

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "cic-plugin-demo"
version = "0.1.0"

[project.entry-points."cic.bounds"]
cp_twin = "cic_plugin_demo:BOUND"
[project.entry-points."cic.searches"]
one_chain = "cic_plugin_demo:SEARCH"
[project.entry-points."cic.estimators"]
answer_count = "cic_plugin_demo:ESTIMATOR"
wordiness = "cic_plugin_demo:WORDINESS"
[project.entry-points."cic.calculators"]
mean_words = "cic_plugin_demo:MEAN_WORDS"
[project.entry-points."cic.engines"]
replay = "cic_plugin_demo.replay:ReplayEngine"
[project.entry-points."cic.harnesses"]
demo-scores = "cic_plugin_demo:HARNESS"
[project.entry-points."cic.drift_tests"]
wordier = "cic_plugin_demo:WORDIER"
[project.entry-points."cic.alerts"]
answers-got-wordier = "cic_plugin_demo:ALERT"
"""

MODULE = '''
"""A third party's additions to CIC, one of each kind."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl

from cic.llm.uncertainty.calculators import Calculator
from cic.llm.uncertainty.estimators import Estimator
from cic.pipeline.alerts import WARNING, AlertKind
from cic.stats.bounds import BOUNDS
from cic.stats.drift import DriftRule, DriftTest
from cic.stats.searches import FixedSequence
from cic.store.harness import Harness

BOUND = dataclasses.replace(BOUNDS["cp"], name="cp_twin", label="Clopper-Pearson (plug-in twin)", aliases=())
SEARCH = FixedSequence("one_chain", "one fixed-sequence chain (plug-in)", "FWER <= delta: fixed-sequence testing "
                       "from the n_min-th score", "high-probability", first_test=True,
                       claim="P(R(t_hat) <= alpha) >= 1 - delta")
ESTIMATOR = Estimator("answer_count", lambda stats: float(len(stats.texts)))
MEAN_WORDS = Calculator("mean_words", lambda stats: float(np.mean([len(t.split()) for t in stats.texts])))
WORDINESS = Estimator("wordiness", lambda stats: stats.stat("mean_words"), frozenset({"mean_words"}))


def _wordier(before, after):
    """Did the scores' mean rise by more than half a standard deviation? (p: 0.001 if so, else 1)."""
    moved = float(np.mean(after) - np.mean(before))
    return DriftTest("wordier", moved, 0.001 if moved > 0.5 * np.std(before) else 1.0, len(before), len(after),
                     f"answers got wordier (mean score up {moved:.2f})")


WORDIER = DriftRule("wordier", "scores", _wordier)
ALERT = AlertKind("answers got wordier", WARNING, 40, test="wordier")


def _read(path: Path) -> pl.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pl.DataFrame(rows).with_columns(model=pl.lit("demo"), dataset=pl.lit("demo"), source=pl.lit("demo"))


HARNESS = Harness("demo-scores", "a demo harness's scores", lambda record: False, _read,
                  lambda path: path.name.endswith(".demo.jsonl"))
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plug-in package built and installed (pip, no index, no build isolation) into a folder of its own."""
    root = tmp_path_factory.mktemp("plugin")
    source, target = root / "src", root / "site"
    (source / "cic_plugin_demo").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "cic_plugin_demo" / "__init__.py").write_text(MODULE)
    (source / "cic_plugin_demo" / "replay.py").write_text((Path(__file__).parent / "support" / "replay_engine.py")
                                                         .read_text())
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target


def cic_with(plugin: Path, cwd: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """The installed `cic` with the plug-in's folder on the path."""
    env = {**os.environ, "PYTHONPATH": str(plugin), "COLUMNS": "200"}
    return subprocess.run([str(Path(sys.executable).with_name("cic")), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


@pytest.mark.slow  # builds and pip-installs a package, then runs the installed cic
def test_a_plugin_bound_and_search_certify_from_the_cli(plugin: Path, tmp_path: Path) -> None:
    """`--bound cp_twin --search one_chain`, both from the plug-in, certify what cp and fixed_sequence do."""
    rng = np.random.default_rng(0)
    u = rng.random(800)
    e = (rng.random(800) < 0.4 * u).astype(int)
    pl.DataFrame({"score": u, "error": e}).write_parquet(tmp_path / "t.parquet")
    run = cic_with(plugin, tmp_path, "calibrate", "t.parquet", "--alpha", "0.15", "--bound", "cp_twin", "--search",
                   "one_chain", "--json", "r.json")
    assert run.returncode == 0, run.stderr
    got = json.loads((tmp_path / "r.json").read_text())
    expected = cic.calibrate(u, e, alpha=0.15, search="fixed_sequence")
    assert (got["bound"], got["search"]) == ("cp_twin", "one_chain")
    assert got["threshold"] == expected.threshold and got["n_accepted"] == expected.n_accepted


@pytest.mark.slow  # builds and pip-installs a package, then runs the installed cic
def test_a_plugin_harness_is_recognised_by_cic_convert(plugin: Path, tmp_path: Path) -> None:
    rows = [{"estimator": "demo_score", "criterion": "demo", "question_id": f"q{i}", "score": i / 10,
             "error": int(i % 3 == 0)} for i in range(10)]
    (tmp_path / "run.demo.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = cic_with(plugin, tmp_path, "convert", "run.demo.jsonl", "--out", "scores.parquet")
    assert run.returncode == 0, run.stderr
    table = pl.read_parquet(tmp_path / "scores.parquet")
    assert table.height == 10 and set(table["estimator"]) == {"demo_score"}


@pytest.mark.slow  # builds and pip-installs a package, then runs the installed cic
def test_every_kind_resolves_from_the_plugin_and_a_broken_one_is_named(plugin: Path, tmp_path: Path) -> None:
    """The estimator, the statistic, the engine, the drift test and its alert kind resolve by name in a fresh
    process; a built-in name never loads a plug-in; an entry point that does not load is named, with why, when its
    name is asked for."""
    probe = textwrap.dedent("""
        from cic.llm.engines.registry import engine_class
        from cic.llm.uncertainty.calculators import CALCULATORS
        from cic.llm.uncertainty.estimators import ESTIMATORS
        from cic.pipeline.alerts import ALERT_KINDS, test_kind
        from cic.stats.bounds import BOUNDS
        from cic.stats.drift import ON_SCORES, drift_rules
        BOUNDS["cp"]
        import sys
        assert "cic_plugin_demo" not in sys.modules  # a built-in name loads no third party
        print(engine_class("replay").__module__, ESTIMATORS.lookup("answer_count").name,
              CALCULATORS.lookup("mean_words").name, ALERT_KINDS.lookup("answers-got-wordier").severity,
              [rule.name for rule in drift_rules(ON_SCORES)], test_kind("wordier").name.replace(" ", "_"))
    """)
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cic_plugin_demo.replay", "answer_count", "mean_words", "warning",
                                   "['score_shift',", "'wordier']", "answers_got_wordier"]
    broken = tmp_path / "broken"
    (broken / "cic_broken-0.1.dist-info").mkdir(parents=True)
    (broken / "cic_broken-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: cic-broken\n"
                                                                    "Version: 0.1\n")
    (broken / "cic_broken-0.1.dist-info" / "entry_points.txt").write_text("[cic.bounds]\nbad = no_such_module:X\n")
    pl.DataFrame({"score": [0.1, 0.2], "error": [0, 1]}).write_parquet(tmp_path / "t.parquet")
    run = cic_with(broken, tmp_path, "calibrate", "t.parquet", "--alpha", "0.1", "--bound", "bad")
    assert run.returncode == 2 and "plug-in 'bad' (no_such_module:X, entry point group cic.bounds) did not load" in \
        " ".join(run.stderr.split() + run.stdout.split())


def test_a_registry_checks_its_base_and_unregisters() -> None:
    class Thing:
        def __init__(self, name: str) -> None:
            self.name = name

    things: Registry[Thing] = Registry("thing", (Thing("a"),), base=Thing)
    with pytest.raises(UserError, match="thing 'b': 'b' is not a .*Thing; register one"):
        things.register("b", name="b")  # type: ignore[arg-type]

    @things.register(name="c")
    class Special(Thing):
        pass

    assert things["c"] is Special and things.unregister("C") is Special and "c" not in things
    with pytest.raises(UserError, match="thing = 'c': unknown"):
        things.unregister("c")


@pytest.mark.slow  # builds and pip-installs a package, then runs the installed cic run (Prefect, Ray, DuckDB)
def test_cic_run_answers_scores_and_certifies_with_the_plugins_engine_estimator_bound_and_search(
        plugin: Path, tmp_path: Path) -> None:
    """`cic run` on a config naming only the plug-in's engine (`engine: replay`), estimator (`wordiness`, read
    from its own statistic), bound and search: Ray's workers load the engine from the plug-in, and the store
    holds its answers, their scores and gates made with the plug-in's bound and search. The question it has no
    answer for is named as its engine's, within its options' share."""
    import yaml

    from cic.data.loaders import load_questions
    from cic.store import Store

    questions = load_questions("trivia_qa", limit=40, seed=0)  # the run's own sample: the config's seed is 0
    rows = []
    for i, q in enumerate(questions.iter_rows(named=True)):
        wrong = i % 4 == 0  # a quarter answered wordily and wrongly
        text = "it might perhaps be something else entirely" if wrong else q["answer"]
        rows += [{"question_id": q["question_id"], "sample_index": s, "text": text} for s in range(3) if i > 0]
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "plugin.yaml").write_text(yaml.safe_dump({
        "name": "plugin", "models": [{"name": "replayed", "engine": "replay",
                                      "options": {"file": str(tmp_path / "answers.jsonl"), "max_failed_share": 0.05}}],
        "datasets": [{"name": "trivia_qa", "limit": 40, "criteria": ["exact_match"]}],
        "generation": {"n_samples": 2, "questions_per_batch": 20},
        "uncertainty": {"estimators": ["wordiness"]},
        "calibration": {"alphas": [0.3], "bounds": ["cp_twin"], "searches": ["one_chain"], "n_splits": 4},
        "ray": {"num_cpus": 1}, "storage": {"db": "plugin.duckdb", "report_dir": "reports"}}))
    run = cic_with(plugin, tmp_path, "run", "--config", "plugin.yaml", "--no-mlflow", timeout=600)
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 0, out[-3000:]
    assert "replayed: 1 of 40 questions got no answer from its engine (replay) (within options.max_failed_share = " \
           "0.05)" in out
    with Store.open(tmp_path / "plugin.duckdb", read_only=True) as store:
        generations = store.read("generations")
        scores = store.read("scores")
        gates = store.read("calibrations")
    assert generations.height == 39 * 3 and set(generations["text"]) == {r["text"] for r in rows}
    words = {r["question_id"]: float(len(r["text"].split())) for r in rows}  # every sample says the same
    assert set(scores["estimator"]) == {"wordiness"}
    assert dict(scores.select("question_id", "value").iter_rows()) == words
    assert gates.height >= 1 and set(gates["bound"]) == {"cp_twin"} and set(gates["search"]) == {"one_chain"}
