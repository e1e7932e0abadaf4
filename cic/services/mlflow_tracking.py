"""MLflow logging through `MlflowClient` with explicit run ids (the fluent API is thread-local).

One experiment per dataset; a run per (model, dataset, estimator, criterion), its per-α results a logged
table (the layout is `cic.services.mlflow_layout`'s). Every run carries a `cic.log_key` tag — a hash of everything
that shaped its numbers — so logging the same work twice finds the finished run and writes nothing (no duplicates on
reruns, and `cic log` can fill in whatever a tracking outage left out).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

from cic.errors import ServiceDown
from cic.services.mlflow_artifacts import local_artifact_location
from cic.services.mlflow_claims import claimed

log = logging.getLogger("cic.tracking")

PARENT_RUN_TAG = "mlflow.parentRunId"
LOG_KEY_TAG = "cic.log_key"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_KIND = "custom_model_development"  # MLflow 3 opens these on the runs view, not GenAI traces
PARENT_LOG_KEY_TAG = "cic.parent_log_key"  # nested runs of the layout before per_alpha.json: cleaned up if partial
# requests one logger keeps in flight against a server: below urllib3's pool of 10 connections per host
# (MLFLOW_HTTP_POOL_MAXSIZE), with two groups logged at once
REQUESTS_IN_FLIGHT = 4
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri(explicit: str | None = None) -> str:
    """The tracking URI: explicit, else $MLFLOW_TRACKING_URI, else a local SQLite file."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


@dataclass(frozen=True)
class GroupTable:
    """A table logged with `MlflowClient.log_table` (column -> values) and small text files logged beside it."""

    name: str
    columns: Mapping[str, Sequence[Any]]
    texts: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupLog:
    """Everything logged for one (model, dataset, estimator, criterion) group."""

    experiment: str
    run_name: str
    log_key: str
    tags: Mapping[str, str]
    params: Mapping[str, Any]
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    artifacts: Sequence[Path] = ()
    table: GroupTable | None = None
    # metric name -> {step: value}; the step is alpha x 100, so MLflow's charts draw each metric against alpha
    series: Mapping[str, Mapping[int, float | None]] = field(default_factory=dict)
    dataset: DatasetRef | None = None


@dataclass(frozen=True)
class DatasetRef:
    """The question set a group was calibrated on, logged as the run's MLflow dataset input."""

    name: str
    digest: str
    source: str
    profile: Mapping[str, Any] = field(default_factory=dict)


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Refuse, within `timeout_s`, an HTTP tracking server that does not answer (MLflow's client would retry
    with backoff for minutes); local stores (sqlite, file) are always reachable."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return  # something answered; MLflow's own calls will say what is wrong
    except (OSError, ValueError) as exc:
        raise ServiceDown(f"MLflow tracking server {tracking_uri} does not answer within {timeout_s:g} s "
                          f"({getattr(exc, 'reason', exc)}); start it, or fix MLFLOW_TRACKING_URI / --tracking-uri "
                          "(the results stay in the store: `cic log` logs them later)") from None


def experiment_id(client: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment `name`, created on first use (restored if it was deleted)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        location = artifact_location or local_artifact_location(client.tracking_uri, name)
        try:
            return client.create_experiment(name, artifact_location=location,
                                            tags={EXPERIMENT_KIND_TAG: MODEL_KIND})
        except MlflowException as exc:  # another group (thread or process) created it since the lookup: use it
            found = client.get_experiment_by_name(name) if exc.error_code == "RESOURCE_ALREADY_EXISTS" else None
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    if EXPERIMENT_KIND_TAG not in found.tags:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_KIND)
    return found.experiment_id


def find_logged(client: MlflowClient, log_key: str) -> str | None:
    """The run id of a finished group run with this log key in any experiment, so a group logged under another
    prefix is not logged twice. A partial group left by a crash mid-logging is removed, never duplicated."""
    everywhere = [e.experiment_id for e in client.search_experiments()]
    if not everywhere:
        return None
    runs = client.search_runs(everywhere, filter_string=f"tags.`{LOG_KEY_TAG}` = '{log_key}'", max_results=10)
    done = RunStatus.to_string(RunStatus.FINISHED)
    finished = [r.info.run_id for r in runs if r.info.status == done]
    for stale in (r for r in runs if r.info.status != done):
        children = client.search_runs([stale.info.experiment_id],
                                      filter_string=f"tags.`{PARENT_LOG_KEY_TAG}` = '{log_key}'", max_results=5000)
        for run in children:
            if run.data.tags.get(PARENT_RUN_TAG) == stale.info.run_id:
                client.delete_run(run.info.run_id)
        client.delete_run(stale.info.run_id)
    return finished[0] if finished else None


def _params(values: Mapping[str, Any]) -> list[Param]:
    return [Param(k, v if isinstance(v, str) else json.dumps(v, default=str)[:6000]) for k, v in values.items()]


def _series(series: Mapping[str, Mapping[int, float | None]], timestamp: int) -> list[Metric]:
    return [Metric(name, float(v), timestamp, step) for name, points in series.items() for step, v in points.items()
            if v is not None and math.isfinite(float(v))]


def _metrics(values: Mapping[str, float | None], timestamp: int) -> list[Metric]:
    return [Metric(k, float(v), timestamp, 0) for k, v in values.items()
            if v is not None and math.isfinite(float(v))]


def requests_in_flight(tracking_uri: str) -> int:
    """How many requests a logger keeps in flight: several against a server (each request waits on the network
    and the server's database, not on this process), one against a local store (its writes serialise anyway)."""
    return REQUESTS_IN_FLIGHT if tracking_uri.startswith(("http://", "https://")) else 1


def log_group(client: MlflowClient, group: GroupLog, *, artifact_location: str | None = None,
              in_flight: int = 1) -> tuple[str, bool]:
    """Log a group's run unless already logged; returns (run id, newly logged).

    With `in_flight` > 1 the run's metrics, inputs, artifacts and table are sent concurrently; the run is marked
    FINISHED only after every one of them succeeded, so a cut-off or failed group is found and replaced by the
    next logging pass (`find_logged`).
    """
    with claimed(client.tracking_uri, group.log_key):  # one logger per group across processes
        return _log_unclaimed(client, group, artifact_location=artifact_location, in_flight=in_flight)


def _log_unclaimed(client: MlflowClient, group: GroupLog, *, artifact_location: str | None,
                   in_flight: int) -> tuple[str, bool]:
    existing = find_logged(client, group.log_key)
    if existing is not None:
        return existing, False
    exp_id = experiment_id(client, group.experiment, artifact_location)
    parent = client.create_run(exp_id, run_name=group.run_name, tags={**group.tags, LOG_KEY_TAG: group.log_key})
    run_id = parent.info.run_id
    now = parent.info.start_time
    steps: list[Callable[[], None]] = [lambda: client.log_batch(
        run_id, metrics=_metrics(group.metrics, now) + _series(group.series, now), params=_params(group.params))]
    if group.dataset is not None:
        steps.append(lambda: _log_dataset(client, run_id, group.dataset))
    steps += [lambda path=path: _log_artifact(client, run_id, path) for path in group.artifacts]
    if group.table is not None:
        steps.append(lambda: _log_table(client, parent.info.artifact_uri, run_id, group.table))
    try:
        if in_flight > 1:
            with ThreadPoolExecutor(in_flight, thread_name_prefix="cic-mlflow") as pool:
                for sent in [pool.submit(step) for step in steps]:
                    sent.result()
        else:
            for step in steps:
                step()
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id, True


def _log_dataset(client: MlflowClient, run_id: str, ref: DatasetRef) -> None:
    client.log_inputs(run_id, datasets=[DatasetInput(
        Dataset(name=ref.name, digest=ref.digest, source_type="cic-store", source=ref.source,
                profile=json.dumps(dict(ref.profile), default=str)),
        tags=[InputTag("mlflow.data.context", "calibration")])])


def _log_artifact(client: MlflowClient, run_id: str, path: Path) -> None:
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path=path.name)
    else:
        client.log_artifact(run_id, str(path))


def _log_table(client: MlflowClient, artifact_uri: str, run_id: str, table: GroupTable) -> None:
    """The table (MLflow's table view reads it) and its texts, the texts in one upload to the run's artifacts."""
    import pandas as pd

    columns = pd.DataFrame({k: list(v) for k, v in table.columns.items()}, dtype=object)  # no pandas "str" columns
    client.log_table(run_id, columns, table.name)  # (MLflow 3.17 warns on those under pandas 3)
    if table.texts:  # straight to the run's artifact location (client.log_text would look the run up first)
        with tempfile.TemporaryDirectory(prefix="cic-texts-") as texts:
            for name, text in table.texts.items():
                (Path(texts) / name).write_text(text, encoding="utf-8")
            get_artifact_repository(artifact_uri, tracking_uri=client.tracking_uri).log_artifacts(texts)
