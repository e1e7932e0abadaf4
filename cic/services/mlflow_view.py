"""MLflow's own chart view of an experiment, set up by CIC: coverage and test FDR against α for every model.

MLflow's defaults fit training curves (x = "Step", the first 10 runs shown, a GenAI overview first); a certificate
is read against α. So CIC saves a view the way MLflow's own "Share" button does — an experiment tag
`mlflow.sharedViewState.<key>` holding the page's state, opened by `?viewStateShareKey=<key>` — with, per bound ×
search, a line chart of coverage and one of test FDR whose x axis is the logged series `alpha_by_alpha_pct` (α
itself), the FDR chart drawing y = α beside it, every run shown, and a table whose columns are what differs between
runs (model, estimator, criterion, base error rate, certified gates). The experiment's description (shown on its
first page, GenAI or training) links to the view: from the experiment list, two clicks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from mlflow import MlflowClient
from mlflow.entities import Metric

VIEW_KEY = "cic-against-alpha"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
NOTE_TAG = "mlflow.note.content"
CIC_NOTE_TAG = "cic.note"  # the description CIC wrote last: a description a person edited since is left alone
ALPHA_SERIES = "alpha_by_alpha_pct"  # value α at step 100·α: the x axis of the view, and its line y = α
SECTION_ID = "cic-against-alpha"
PIPELINE_RUNS = "tags.`cic.kind` = 'pipeline'"
_SERIES = re.compile(r"^(?:coverage|fdr)_by_alpha_pct\.(?P<bound>[^.]+)\.(?P<search>.+)$")
COLUMNS = ("params.`model`", "params.`estimator`", "params.`criterion`", "metrics.`base_error_rate`",
           "metrics.`certified_gates`", "metrics.`unattainable_gates`", "metrics.`n_questions`", "tags.`cic.labels`")


def alpha_points(steps: Iterable[int]) -> dict[int, float]:
    """The α series for the given steps (100·α): its value is α, so a chart can use it as x axis and as y = α."""
    return {step: step / 100 for step in steps}


def bound_searches(metric_keys: Iterable[str], order: Iterable[str] = ()) -> list[tuple[str, str]]:
    """The (bound, search) pairs with a per-α coverage or FDR series (a model that never certifies logs coverage
    0 and no FDR), those named in `order` ("bound.search") first, then the rest sorted."""
    pairs = list({(m["bound"], m["search"]) for key in metric_keys if (m := _SERIES.match(key))})
    first = [tuple(name.split(".", 1)) for name in order]
    return sorted(pairs, key=lambda p: (first.index(p) if p in first else len(first), p))


def _line(name: str, keys: list[str], title: str) -> dict[str, Any]:
    """One line chart card of MLflow's runs chart view, x axis the α series."""
    return {"uuid": f"cic-{name}", "type": "LINE", "runsCountToCompare": 100, "metricSectionId": SECTION_ID,
            "deleted": False, "isGenerated": False, "displayName": title, "metricKey": keys[0],
            "selectedMetricKeys": keys, "lineSmoothness": 0, "scaleType": "linear", "xAxisScaleType": "linear",
            "xAxisKey": "metric", "selectedXAxisMetricKey": ALPHA_SERIES, "useGlobalXaxisKey": False,
            "useGlobalLineSmoothing": False, "displayPoints": True}


def view_state(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The page state MLflow reads from the view tag: search facets and UI state (its own field names)."""
    cards = []
    for bound, search in pairs:
        suffix = f"{bound}.{search}"
        cards.append(_line(f"coverage.{suffix}", [f"coverage_by_alpha_pct.{suffix}"],
                           f"Coverage against α ({bound}, {search} search): share of test questions answered"))
        cards.append(_line(f"fdr.{suffix}", [f"fdr_by_alpha_pct.{suffix}", ALPHA_SERIES],
                           f"Test FDR against α ({bound}, {search} search); {ALPHA_SERIES} is the line FDR = α"))
    return {
        "searchFilter": PIPELINE_RUNS, "orderByKey": "attributes.start_time", "orderByAsc": False,
        "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": [],
        "selectedColumns": list(COLUMNS), "runsExpanded": {}, "runsPinned": [], "runsHidden": [],
        "runsVisibilityMap": {}, "runsHiddenMode": "SHOW_ALL", "compareRunCharts": cards,
        "compareRunSections": [{"uuid": SECTION_ID, "name": "CIC: every model against α", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False}],
        "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False, "groupBy": None,
        "groupsExpanded": {}, "autoRefreshEnabled": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "globalLineChartConfig": {"xAxisKey": "metric", "selectedXAxisMetricKey": ALPHA_SERIES, "lineSmoothness": 0},
        "chartsSearchFilter": "",
    }


def view_path(experiment_id: str) -> str:
    """The UI route of the view (after the server's address): the runs page, chart mode, the saved state."""
    query = urlencode({"workflowType": "machine_learning", "compareRunsMode": "CHART",
                       "viewStateShareKey": VIEW_KEY})
    return f"#/experiments/{experiment_id}/runs?{query}"


def note(experiment_id: str, pairs: list[tuple[str, str]]) -> str:
    """The experiment's description: what the view shows and the link to it."""
    shown = ", ".join(f"{b} · {s}" for b, s in pairs)
    return (f"**Every model against α** — [open the chart view]({view_path(experiment_id)}): coverage and test FDR "
            f"(with the line FDR = α) against α for every CIC run here, one chart per bound · search ({shown}). "
            "Each run's `per_alpha.json` (Artifacts) holds the certified thresholds.")


def publish(client: MlflowClient, experiment_id: str, order: Iterable[str] = ()) -> str | None:
    """Save (or refresh) the view of an experiment from the series its CIC runs logged, filling in the α series
    of runs logged before it existed; returns the view's route, or None when no run has a per-α series."""
    runs = client.search_runs([experiment_id], filter_string=PIPELINE_RUNS, max_results=5000)
    pairs = bound_searches({key for run in runs for key in run.data.metrics}, order)
    if not pairs:
        return None
    for run in runs:
        if ALPHA_SERIES not in run.data.metrics:
            _fill_alpha(client, run.info.run_id, f"coverage_by_alpha_pct.{pairs[0][0]}.{pairs[0][1]}")
    client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(view_state(pairs), separators=(",", ":")))
    tags = client.get_experiment(experiment_id).tags
    if tags.get(NOTE_TAG) in (None, "", tags.get(CIC_NOTE_TAG)):  # never over a description a person wrote
        text = note(experiment_id, pairs)
        client.set_experiment_tag(experiment_id, NOTE_TAG, text)
        client.set_experiment_tag(experiment_id, CIC_NOTE_TAG, text)
    return view_path(experiment_id)


def _fill_alpha(client: MlflowClient, run_id: str, series: str) -> None:
    """Log the α series of a run logged before CIC logged it, at the steps of one of its per-α series."""
    history = client.get_metric_history(run_id, series)
    if history:
        stamp = history[0].timestamp
        client.log_batch(run_id, metrics=[Metric(ALPHA_SERIES, value, stamp, step)
                                          for step, value in alpha_points({m.step for m in history}).items()])


def open_lines(tracking_uri: str, views: dict[str, str], ui_address: str = "http://127.0.0.1:5000") -> list[str]:
    """What a console ends with: how to open MLflow on this store, and each experiment's α view. A server is
    opened where it is; a local store through `mlflow ui` (this environment's), which serves on `ui_address`."""
    import shutil
    import sys
    from pathlib import Path

    from cic.services.mlflow_artifacts import sqlite_file

    if tracking_uri.startswith(("http://", "https://")):
        address, start = tracking_uri.rstrip("/"), None
    else:
        beside = Path(sys.executable).parent / "mlflow"
        program = str(beside) if beside.exists() else (shutil.which("mlflow") or "mlflow")
        store = f"sqlite:///{sqlite_file(tracking_uri)}" if sqlite_file(tracking_uri) else tracking_uri
        address, start = ui_address, f"{program} ui --backend-store-uri {store}"
    lines = [f"MLflow UI: `{start}`, then {address}" if start else f"MLflow UI: {address}"]
    lines += [f"  {name}, every model against α: {address}/{route}" for name, route in sorted(views.items())]
    return lines
