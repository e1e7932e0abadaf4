"""CIC's α view in MLflow, read back through MLflow's own API from a real store: every chart names series that
every run has, its x axis is α, the FDR chart draws y = α, every model's run is shown, and the experiment's
description links to it — what MLflow's chart view reads when a person opens the link."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from cic.services import mlflow_tracking as tracking
from cic.services import mlflow_view as view
from cic.services.mlflow_layout import alpha_series
from cic.services.mlflow_results import publish_views

ALPHAS = (0.05, 0.1, 0.15, 0.2, 0.25)
PAIRS = (("cp", "fallback"), ("hoeffding", "paper"))


def _group(model: str, estimator: str, experiment: str, *, with_alpha: bool = True,
           kind: str = "pipeline") -> tracking.GroupLog:
    """One group's run with the layout's per-α series (coverage grows with α; FDR below it)."""
    gates = pl.DataFrame([{"alpha": a, "bound": b, "search": s, "threshold": a, "bound_value": a * 0.9}
                          for a in ALPHAS for b, s in PAIRS])
    splits = pl.DataFrame([{"alpha": a, "bound": b, "search": s, "fdr_mean": a * 0.8, "coverage_mean": 2 * a}
                           for a in ALPHAS for b, s in PAIRS])
    series = alpha_series(gates, splits)
    if not with_alpha:  # a run logged before CIC logged the α series
        series.pop(view.ALPHA_SERIES)
    return tracking.GroupLog(experiment=experiment, run_name=f"{model} · {estimator} · em",
                             log_key=f"{experiment}-{model}-{estimator}-{kind}",
                             tags={"cic.kind": kind, "cic.labels": "worst"},
                             params={"model": model, "estimator": estimator, "criterion": "em"},
                             metrics={"base_error_rate": 0.3, "certified_gates": 10.0, "unattainable_gates": 0.0,
                                      "n_questions": 100.0}, series=series)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> MlflowClient:
    """One real local store for the module (setting one up takes seconds); each test its own experiment."""
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db")


def _metric_steps(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_the_view_charts_every_model_against_alpha_as_mlflow_reads_it(client: MlflowClient) -> None:
    runs = [tracking.log_group(client, _group(m, e, "cic-trivia_qa"))[0] for m in ("qwen", "smollm2")
            for e in ("se", "eigv")]
    tracking.log_group(client, _group("qwen", "se", "cic-trivia_qa", kind="recalibration"))  # not in the view
    experiment = client.get_experiment_by_name("cic-trivia_qa")
    views = publish_views(client, ["cic-trivia_qa", "cic-absent"])
    assert views == {"cic-trivia_qa": view.view_path(experiment.experiment_id)}

    tags = client.get_experiment(experiment.experiment_id).tags
    state = json.loads(tags[view.VIEW_TAG])
    shown = client.search_runs([experiment.experiment_id], filter_string=state["searchFilter"])
    assert sorted(r.info.run_id for r in shown) == sorted(runs)  # every model's run, each group once
    assert state["runsHiddenMode"] == "SHOW_ALL"  # not MLflow's "first 10 runs"
    cards = state["compareRunCharts"]
    assert [c["displayName"].split(" (")[0] for c in cards] == ["Coverage against α", "Test FDR against α"] * 2
    assert [c["selectedMetricKeys"][0] for c in cards[:2]] == ["coverage_by_alpha_pct.cp.fallback",
                                                               "fdr_by_alpha_pct.cp.fallback"]  # the default first
    for card in cards:
        assert card["type"] == "LINE" and card["metricSectionId"] == state["compareRunSections"][0]["uuid"]
        assert card["xAxisKey"] == "metric" and card["selectedXAxisMetricKey"] == view.ALPHA_SERIES
        for run_id in runs:
            x = _metric_steps(client, run_id, view.ALPHA_SERIES)
            for key in card["selectedMetricKeys"]:
                y = _metric_steps(client, run_id, key)
                assert set(y) == set(x) == {round(100 * a) for a in ALPHAS}  # each point has its α
            assert all(value == step / 100 for step, value in x.items())  # the x axis is α itself
    assert all(view.ALPHA_SERIES in c["selectedMetricKeys"] for c in cards if c["metricKey"].startswith("fdr"))
    run = client.get_run(runs[0])
    columns = {"params": run.data.params, "metrics": run.data.metrics, "tags": run.data.tags}
    for column in state["selectedColumns"]:  # the table opens on what differs, each column a value every run has
        kind, key = column.split(".", 1)
        assert key.strip("`") in columns[kind], column
    note = tags[view.NOTE_TAG]
    assert f"viewStateShareKey={view.VIEW_TAG.removeprefix('mlflow.sharedViewState.')}" in note
    assert f"({view.view_path(experiment.experiment_id)})" in note and "cp · fallback" in note


def test_a_description_a_person_wrote_is_kept_and_cics_own_is_refreshed(client: MlflowClient) -> None:
    tracking.log_group(client, _group("qwen", "se", "cic-notes"))
    exp_id = client.get_experiment_by_name("cic-notes").experiment_id
    view.publish(client, exp_id)
    first = client.get_experiment(exp_id).tags[view.NOTE_TAG]
    tracking.log_group(client, _group("smollm2", "se", "cic-notes"))
    view.publish(client, exp_id)
    assert client.get_experiment(exp_id).tags[view.NOTE_TAG] == first  # same pairs: same text, still CIC's
    client.set_experiment_tag(exp_id, view.NOTE_TAG, "Team notes: nightly gates for the support bot.")
    view.publish(client, exp_id, order=["hoeffding.paper"])
    tags = client.get_experiment(exp_id).tags
    assert tags[view.NOTE_TAG] == "Team notes: nightly gates for the support bot."
    first_chart = json.loads(tags[view.VIEW_TAG])["compareRunCharts"][0]
    assert first_chart["metricKey"] == "coverage_by_alpha_pct.hoeffding.paper"


def test_runs_logged_before_the_alpha_series_get_it_when_the_view_is_saved(client: MlflowClient) -> None:
    old = tracking.log_group(client, _group("qwen", "se", "cic-old", with_alpha=False))[0]
    assert view.ALPHA_SERIES not in client.get_run(old).data.metrics
    view.publish(client, client.get_experiment_by_name("cic-old").experiment_id)
    assert _metric_steps(client, old, view.ALPHA_SERIES) == {round(100 * a): a for a in ALPHAS}


def test_an_experiment_without_per_alpha_series_gets_no_view(client: MlflowClient) -> None:
    bare = tracking.GroupLog(experiment="cic-x", run_name="r", log_key="k", tags={"cic.kind": "pipeline"},
                             params={"model": "m"})
    tracking.log_group(client, bare)
    exp_id = client.get_experiment_by_name("cic-x").experiment_id
    assert view.publish(client, exp_id) is None
    assert view.VIEW_TAG not in client.get_experiment(exp_id).tags


def test_the_closing_lines_say_how_to_open_mlflow_for_a_server_and_for_a_local_store(tmp_path: Path) -> None:
    views = {"cic-trivia_qa": view.view_path("3")}
    server = view.open_lines("http://mlflow.internal:5000/", views)
    assert server == ["MLflow UI: http://mlflow.internal:5000",
                      f"  cic-trivia_qa, every model against α: http://mlflow.internal:5000/{views['cic-trivia_qa']}"]
    local = view.open_lines(f"sqlite:///{tmp_path}/m.db", views)
    assert local[0].startswith("MLflow UI: `") and f"ui --backend-store-uri sqlite:///{tmp_path}/m.db`" in local[0]
    assert local[1].endswith(f"http://127.0.0.1:5000/{views['cic-trivia_qa']}")
    assert view.open_lines(f"sqlite:///{tmp_path}/m.db", {}) == local[:1]  # nothing logged: still how to open it
