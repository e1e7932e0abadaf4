"""SIGKILL of the pipeline at each stage in turn (questions, answer mid-batch, calibrate, MLflow log), each time
resumed by a rerun on the same store: the answers stored before a kill are never requested again, and the end
state — every DuckDB table's contents and every MLflow run — is exactly that of one uninterrupted run. The flow
processes report to the session's Prefect server (a killed run stays Running there, as on a real deployment)."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from mlflow import MlflowClient

from cic import schema
from cic.store import Store
from tests.flows.test_pipeline_e2e import write_config
from tests.support.pipeline_process import run_pipeline_process

pytestmark = [pytest.mark.slow, pytest.mark.faults]
DATASETS = [{"name": "commonsense_qa", "limit": 4}, {"name": "trivia_qa", "limit": 4}]
KILLS = [("questions", 1), ("answer", 2), ("calibrate", 3), ("log", 2)]
VOLATILE = {"created_at", "window_from", "window_to", "event_id"}  # write times (and ids made of them)


def table_contents(db: Path) -> dict[str, pl.DataFrame]:
    """Every table without its write-time columns, sorted by the columns left."""
    with Store.open(db, read_only=True) as store:
        frames = {name: store.read(name).drop([c for c in spec.columns if c in VOLATILE])
                  for name, spec in schema.TABLES.items()}
    return {name: f.sort([c for c, t in f.schema.items() if not isinstance(t, pl.List)]) for name, f in frames.items()}


def mlflow_contents(uri: str) -> list[tuple[Any, ...]]:
    """Every active run as (experiment, run name, status, parent's name, params, metrics, cic tags), sorted."""
    client = MlflowClient(tracking_uri=uri)
    out = []
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], max_results=5000)
        names = {r.info.run_id: r.info.run_name for r in runs}
        for r in runs:
            tags = {k: v for k, v in r.data.tags.items() if k.startswith("cic.") and k != "cic.flow_run_id"}
            out.append((experiment.name, r.info.run_name, r.info.status,
                        names.get(r.data.tags.get("mlflow.parentRunId", ""), ""), sorted(r.data.params.items()),
                        sorted(r.data.metrics.items()), sorted(tags.items())))
    return sorted(out, key=repr)


def _setup(tmp: Path) -> tuple[Path, str]:
    tmp.mkdir()
    return write_config(tmp / "c.yaml", tmp, datasets=DATASETS, per_batch=2), f"sqlite:///{tmp}/mlflow.db"


def _answers_requested(lines: list[str]) -> int:
    """Questions the answer stage of one run set out to answer (the total of its progress lines)."""
    return max((int(line.split("|")[3]) for line in lines if line.startswith("PROGRESS|answer")), default=0)


def test_sigkill_at_every_stage_then_rerun_equals_an_uninterrupted_run(tmp_path: Path, prefect_api: str) -> None:
    clean, clean_uri = _setup(tmp_path / "clean")
    with ThreadPoolExecutor(1) as pool:  # the uninterrupted run beside the killed ones: its own store and MLflow
        uninterrupted = pool.submit(run_pipeline_process, clean, tracking=clean_uri, prefect_api=prefect_api)
        config, uri = _setup(tmp_path / "killed")
        _kill_at_each_stage(config, uri, prefect_api)
        code, lines = uninterrupted.result()
    assert code == 0 and "FINISHED" in lines, (lines[-5:], (clean.parent / "stderr.log").read_text()[-3000:])
    assert not [line for line in lines if line.startswith("LOG_ERROR")], lines[-5:]
    expected_tables, expected_runs = table_contents(clean.parent / "cic.duckdb"), mlflow_contents(clean_uri)
    assert _answers_requested(lines) == sum(d["limit"] for d in DATASETS)

    code, lines = run_pipeline_process(config, tracking=uri, prefect_api=prefect_api)
    assert code == 0 and "FINISHED" in lines, (lines[-5:], (config.parent / "stderr.log").read_text()[-3000:])
    assert not [line for line in lines if line.startswith("LOG_ERROR")], lines[-5:]

    tables = table_contents(config.parent / "cic.duckdb")
    for name, frame in expected_tables.items():
        assert frame.height > 0 or name not in ("generations", "scores", "labels", "calibrations"), name
        assert tables[name].equals(frame), (name, tables[name].height, frame.height)
    runs = mlflow_contents(uri)
    assert len(runs) == len(expected_runs) and runs == expected_runs
    assert all(status == "FINISHED" for _, _, status, *_ in runs)


def _kill_at_each_stage(config: Path, uri: str, prefect_api: str) -> None:
    """SIGKILL a run at each stage of KILLS in turn on one store; after a kill mid-answer, the next run asks only
    for the questions left unanswered."""
    questions = sum(d["limit"] for d in DATASETS)
    stored = 0
    for stage, done in KILLS:
        code, lines = run_pipeline_process(config, tracking=uri, kill_at=(stage, done), prefect_api=prefect_api)
        assert code == -signal.SIGKILL, (stage, lines[-5:], (config.parent / "stderr.log").read_text()[-3000:])
        assert any(line.startswith(f"PROGRESS|{stage}") for line in lines), stage
        if stage == "answer":  # killed mid-stage: some questions stored, not all
            with Store.open(config.parent / "cic.duckdb", read_only=True) as store:
                stored = store.read("generations").select("run_key", "question_id").n_unique()
            assert done <= stored < questions, stored
        elif stored:  # the next run asks only for the questions the kill left unanswered
            assert _answers_requested(lines) == questions - stored, (stored, lines)
            stored = 0
