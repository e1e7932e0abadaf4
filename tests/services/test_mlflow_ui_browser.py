"""MLflow's UI in a real Chromium (Playwright), as a person opens it: from the experiment list, two clicks to a
chart of coverage against α showing both models (`infra/scripts/mlflow_ui_check.py`). Skipped where no browser
or no Playwright exists; the API-level twin in the normal suite is `test_mlflow_view.py`."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.support.local_servers import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None or importlib.util.find_spec("playwright") is None,
                                 reason="no Chromium or Playwright (apt-get install chromium; pip install playwright)")]
SCRIPT = Path(__file__).resolve().parents[2] / "infra/scripts/mlflow_ui_check.py"


def test_two_clicks_from_the_experiment_list_to_coverage_against_alpha_for_both_models(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    score = rng.random(400)
    parts = [pl.DataFrame({"model": model, "dataset": "trivia_qa", "estimator": "semantic_entropy",
                           "criterion": "exact_match", "score": score, "question_id": [f"q{i}" for i in range(400)],
                           "error": (rng.random(400) < base + 0.5 * score).astype(np.int64)})
             for model, base in (("model-a", 0.0), ("model-b", 0.1))]
    table = tmp_path / "two.parquet"
    pl.concat(parts).write_parquet(table)
    shot = tmp_path / "view.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--table", str(table), "--experiment", "cic-trivia_qa",
                           "--models", "model-a,model-b", "--port", str(free_port()), "--out", str(shot)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("click 1: experiment cic-trivia_qa") and "click 2: 'open the chart view'" in proc.stdout
    assert not any(line.startswith("click 3") for line in lines)
    assert "runs of model-a, model-b" in lines[-1] and shot.stat().st_size > 10_000
