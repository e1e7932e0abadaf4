"""What a pipeline run leaves behind, in a form two runs can be compared by: every DuckDB table without its write
times, and every MLflow run without its flow-run id (the kill test compares a resumed run with an uninterrupted
one by these)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
from mlflow import MlflowClient

from cic import schema
from cic.store import Store

VOLATILE = {"created_at", "window_from", "window_to", "event_id"}  # write times (and ids made of them)


def table_contents(db: Path) -> dict[str, pl.DataFrame]:
    """Every table without its write-time columns, sorted by the columns left."""
    with Store.open(db, read_only=True) as store:
        frames = {name: store.read(name).drop([c for c in spec.columns if c in VOLATILE])
                  for name, spec in schema.TABLES.items()}
    return {name: f.sort([c for c, t in f.schema.items() if not isinstance(t, pl.List)]) for name, f in frames.items()}


def mlflow_contents(uri: str) -> list[tuple[Any, ...]]:
    """Every active run as (experiment, run name, status, parent's name, params, metrics, cic tags), sorted."""
    client = MlflowClient(tracking_uri=uri)
    out = []
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], max_results=5000)
        names = {r.info.run_id: r.info.run_name for r in runs}
        for r in runs:
            tags = {k: v for k, v in r.data.tags.items() if k.startswith("cic.") and k != "cic.flow_run_id"}
            out.append((experiment.name, r.info.run_name, r.info.status,
                        names.get(r.data.tags.get("mlflow.parentRunId", ""), ""), sorted(r.data.params.items()),
                        sorted(r.data.metrics.items()), sorted(tags.items())))
    return sorted(out, key=repr)
