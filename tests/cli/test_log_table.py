"""`cic log TABLE`: a precomputed (score, error) table logged to a real MLflow store in the pipeline's layout —
a parent per group, a nested run per bound × search × α with α as a metric — once, however often it is run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from cic.cli import app
from cic.services.mlflow_layout import UNATTAINABLE
from cic.stats.limits import ceiling, score_limit
from tests.support.mlflow_reading import per_alpha

runner = CliRunner()


def _table(path: Path) -> Path:
    rng = np.random.default_rng(0)
    parts = []
    for dataset, base in (("easy", 0.02), ("hard", 0.15)):
        u = rng.random(600)
        wrong = (rng.random(600) < base + 0.4 * u).astype(int)
        parts.append(pl.DataFrame({"model": "m", "dataset": dataset, "estimator": "se", "criterion": "match",
                                   "question_id": [f"q{i}" for i in range(600)], "score": u, "error": wrong}))
    pl.concat(parts).write_parquet(path)
    return path


@pytest.mark.slow
def test_a_table_is_logged_like_the_pipeline_and_only_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    table = _table(tmp_path / "scores.parquet")
    args = ["log", str(table), "--n-splits", "5", "--report-dir", str(tmp_path / "reports")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())  # the sentence may fold anywhere: its place depends on the path's length
    assert "2 group(s) logged, 0 already in MLflow (experiments cic-<dataset>)" in words
    client = MlflowClient(tracking_uri=uri)
    for dataset in ("easy", "hard"):
        experiment = client.get_experiment_by_name(f"cic-{dataset}")
        runs = client.search_runs([experiment.experiment_id], max_results=100)
        assert len(runs) == 1 and runs[0].info.run_name == "m · se · match"
        rows = per_alpha(client, runs[0]).to_dict("records")
        assert len(rows) == 5 * 2 * 2  # alphas × bounds × searches: the pipeline's defaults
        certified = [r for r in rows if r["feasible"]]
        assert certified and all(isinstance(r["threshold"], float) for r in certified)
        assert all(r["threshold"] == UNATTAINABLE and r["fails"] >= 0 for r in rows if not r["feasible"])
        assert all(r["coverage_lcb"] <= r["n_accepted"] / r["n_cal"] for r in certified)  # the two-sided bound
        pairs = pl.read_parquet(table).filter(dataset=dataset)
        for r in rows:  # each row's limits, as `cic.stats.limits` computes them on the group's table
            assert r["score_limit"] == pytest.approx(score_limit(pairs["score"], pairs["error"], r["alpha"]))
            assert r["ceiling"] == pytest.approx(ceiling(pairs["error"].mean(), r["alpha"]))
        history = client.get_metric_history(runs[0].info.run_id, "score_limit_by_alpha_pct")
        assert sorted(m.step for m in history) == [5, 10, 15, 20, 25]
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "0 group(s) logged, 2 already in MLflow" in again.output.replace("\n", "")
    assert "calibrate:" not in again.output  # found by the table's key: nothing calibrated again
    assert "every model against α" in again.output  # and the view to open, as the first time


def test_a_table_whose_rows_disagree_is_refused_before_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    table = _table(tmp_path / "scores.parquet")
    frame = pl.read_parquet(table)
    other = frame.filter(pl.col("dataset") == "easy").with_columns(estimator=pl.lit("pe"),
                                                                     error=1 - pl.col("error"))
    pl.concat([frame, other]).write_parquet(table)
    result = runner.invoke(app, ["log", str(table), "--n-splits", "5", "--report-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "is both right and wrong under criterion 'match'" in result.output
    assert not (tmp_path / "mlflow.db").exists()
