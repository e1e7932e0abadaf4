"""The probe stage on a store: probes fitted on a run's kept states and stored with their scores, the accuracy
probe scoring only questions outside its fit split, nothing fitted twice, and every certificate path refusing a
fit-split question in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from cic import schema
from cic.errors import UserError
from cic.llm.hidden import feature_matrix, pack
from cic.llm.probes import Probe
from cic.pipeline.config import CalibrationConfig, ProbesConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.serving import served_entries
from cic.pipeline.run.probe_stage import fit_run_probes, stored_probe
from cic.store import Store

N, WIDTH = 400, 8
BOTH = ProbesConfig(kinds=("accuracy", "semantic_entropy"))
CONFIG = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4)


def _run(store: Store, keep: bool = True, seed: int = 0) -> str:
    """A run whose greedy rows kept one layer (width 8) that predicts its errors and its semantic entropy."""
    rng = np.random.default_rng(seed)
    key = store.register_run("m", f"d{seed}", "validation", "p1", {"seed": 0, **({"keep_hidden": [-1]} if keep
                                                                                  else {})})
    ids = [f"q{i:04d}" for i in range(N)]
    prompt, answer = rng.normal(size=(N, 1, WIDTH)), rng.normal(size=(N, 1, WIDTH))
    errors = (rng.random(N) < 1 / (1 + np.exp(-2 * answer[:, 0, 0]))).astype(int)
    entropy = prompt[:, 0, 1] + 0.1 * rng.normal(size=N)
    rows = [{"run_key": key, "question_id": q, "sample_index": s, "text": "a", "n_tokens": 1, "logprob_sum": -1.0,
             "logprob_mean": -1.0, "is_greedy": s == 0, "option_probs": None, "flags": [],
             "hidden": pack(prompt[i], answer[i]) if s == 0 and keep else None} for i, q in enumerate(ids)
            for s in (0, 1)]
    with store.transaction():
        store.upsert("generations", pl.DataFrame(rows, schema=schema.GENERATIONS.schema))
        store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": ids,
                                             "estimator": "semantic_entropy[embedding:0.9]", "value": entropy}))
        store.upsert("labels", pl.DataFrame({"run_key": key, "question_id": ids, "criterion": "exact_match",
                                             "aligned": errors == 0, "value": 1.0 - errors}))
    return key


def test_the_stage_stores_both_probes_the_accuracy_one_only_off_its_fit_split_and_fits_once(tmp_path: Path) -> None:
    db = str(tmp_path / "t.duckdb")
    with Store.open(db) as store:
        key, plain = _run(store), _run(store, keep=False, seed=1)
    stats = fit_run_probes(db, [key, plain], BOTH)
    assert len(stats.fitted) == 2 and stats.skipped == ["m · d1: no hidden states kept"]
    with Store.open(db, read_only=True) as store:
        probes = store.read("probes")
        accuracy = probes.filter(pl.col("kind") == "accuracy").row(0, named=True)
        fit = set(accuracy["fit_ids"])
        scored = store.read("scores", run_key=key, estimator=accuracy["estimator"])
        entropy = probes.filter(pl.col("kind") == "semantic_entropy").row(0, named=True)
        assert 0.25 * N < len(fit) < 0.35 * N and accuracy["target"] == "exact_match"
        assert scored.height == N - len(fit) and not fit & set(scored.get_column("question_id"))
        assert store.read("scores", run_key=key, estimator=entropy["estimator"]).height == N
        probe = stored_probe(store, key, accuracy["estimator"])
        kept = store.sql_frame("SELECT question_id, hidden FROM generations WHERE run_key = ? AND sample_index = 0 "
                               "ORDER BY question_id", [key])
        x = feature_matrix(kept.get_column("hidden").to_list(), 1)
        by_id = dict(zip(kept.get_column("question_id"), probe.score(x), strict=True))
        assert all(abs(by_id[q] - v) < 1e-9 for q, v in scored.select("question_id", "value").iter_rows())
    again = fit_run_probes(db, [key], BOTH)
    assert again.fitted == [] and sorted(again.kept) == sorted(probes.get_column("estimator"))
    from cic.pipeline.run.run_digest import probes_line
    from cic.pipeline.run.run_results import PipelineSummary

    said = probes_line(PipelineSummary(db=db, tracking_uri="", report_dir="", experiment_prefix="", probes=stats))
    assert said == "Probes: 2 fitted, 0 kept from an earlier run; skipped m · d1: no hidden states kept."


def test_an_entropy_probe_without_semantic_entropy_to_fit_is_refused_in_the_config() -> None:
    from cic.pipeline.config import PipelineConfig

    base = {"name": "t", "models": [{"name": "m", "spec": "x/y"}], "datasets": [{"name": "trivia_qa"}],
            "generation": {"keep_hidden": [-1]}, "probes": {"kinds": ["semantic_entropy"]}}
    with pytest.raises(ValueError, match="the entropy probe is fitted to the run's sampled semantic entropy; add "
                                        "semantic_entropy to uncertainty.estimators"):
        PipelineConfig.model_validate({**base, "uncertainty": {"estimators": ["answer_nll"]}})
    assert PipelineConfig.model_validate({**base, "uncertainty": {"estimators": ["semantic_entropy"]}}).probes.kinds


@pytest.mark.faults  # scores written on the probe's fit split, as an importer or a hand could
def test_a_probe_is_certified_like_any_score_and_a_fit_question_is_refused_on_every_path(tmp_path: Path) -> None:
    db = str(tmp_path / "t.duckdb")
    with Store.open(db) as store:
        key = _run(store)
    fit_run_probes(db, [key], BOTH)
    calibrate_store(db, [key], CONFIG)
    with Store.open(db) as store:
        gates = store.read("calibrations")
        name = store.read("probes").filter(pl.col("kind") == "accuracy").get_column("estimator")[0]
        mine = gates.filter(pl.col("estimator") == name)
        assert mine.height and set(mine.get_column("criterion")) == {"exact_match"}
        fit = store.read("probes").filter(pl.col("estimator") == name).get_column("fit_ids")[0]
        served = [e for e in served_entries(store) if e.get("estimator") == name and e["serve"] == "gate"]
        assert served and Probe(**{k: tuple(v) if isinstance(v, list) else v for k, v in served[0]["probe"].items()}
                                ).fit_ids == tuple(fit)  # the export carries the probe a server scores with
        store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": fit[:3], "estimator": name,
                                             "value": 0.0}))  # as an importer could: scores on its fit split
        with pytest.raises(UserError) as info:
            store.calibration_frame("m", "d0", name, "exact_match")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{name}: 3 calibration question(s) the probe was fitted on")
    with pytest.raises(UserError, match="the probe was fitted on"):
        calibrate_store(db, [key], CONFIG)


def test_a_probe_groups_mlflow_run_carries_the_probe_itself(tmp_path: Path) -> None:
    """`cic log` / the report stage: the group run of a probe score has probe.json (its layers, weights, fit ids);
    a plain score's run has none. A real local MLflow store (SQLite), not a stand-in."""
    from mlflow import MlflowClient

    from cic.services.mlflow_results import log_store

    db = str(tmp_path / "t.duckdb")
    with Store.open(db) as store:
        key = _run(store)
    fit_run_probes(db, [key], BOTH)
    calibrate_store(db, [key], CONFIG)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_store(db, tracking=tracking, report_dir=str(tmp_path / "reports"))
    client = MlflowClient(tracking)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    files = {r.data.tags["cic.estimator"]: {a.path for a in client.list_artifacts(r.info.run_id)} for r in runs}
    with Store.open(db, read_only=True) as store:
        probes = store.read("probes")
    assert {e for e, paths in files.items() if "probe.json" in paths} == set(probes.get_column("estimator"))
    accuracy = probes.filter(pl.col("kind") == "accuracy").row(0, named=True)
    run = next(r for r in runs if r.data.tags["cic.estimator"] == accuracy["estimator"])
    local = client.download_artifacts(run.info.run_id, "probe.json", str(tmp_path / "down"))
    assert Probe.from_json(Path(local).read_text()).fit_ids == tuple(accuracy["fit_ids"])
