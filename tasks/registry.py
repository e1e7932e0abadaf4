"""Live gates in MLflow's model registry, so a serving system fetches one by name:

    mlflow.artifacts.download_artifacts("models:/<registered name>@live")   # → gate.json

One registered model per serving key (model, dataset, estimator, criterion, alpha, delta, bound, search); one
version per gate (its run in experiment '<prefix>-gates' holds gate.json and the stored row); the alias
`live` points at the live gate's version, and each version's tag `cic.state` follows the store. The store
stays the source of truth: syncing again after an outage brings the registry in line, idempotently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mlflow import MlflowClient

from cic import schema
from cic.pipeline.gates import SERVING_KEY
from cic.stats.calibration import CalibrationResult
from tasks.tracking import experiment_id

LIVE_ALIAS = "live"
GATE_ID_TAG = "cic.gate_id"
STATE_TAG = "cic.state"


def registered_name(row: dict[str, Any]) -> str:
    """The registered model of a gate's serving key (MLflow names may not hold '/' or ':')."""
    name = (f"cic-gate.{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}.alpha={row['alpha']:g}"
            f".delta={row['delta']:g}.{row['bound']}.{row['search']}")
    return re.sub(r"[/:]", "_", name)


def _gate_run(client: MlflowClient, row: dict[str, Any], experiment_prefix: str) -> Any:
    """The run holding the gate's files (created once per gate)."""
    exp = experiment_id(client, f"{experiment_prefix}-gates")
    found = client.search_runs([exp], filter_string=f"tags.`{GATE_ID_TAG}` = '{row['calibration_id']}'",
                               max_results=1)
    if found:
        return found[0]
    run = client.create_run(exp, run_name=f"gate {row['calibration_id'][:12]}", tags={
        GATE_ID_TAG: row["calibration_id"], "cic.model": row["model"], "cic.dataset": row["dataset"],
        "cic.estimator": row["estimator"], "cic.criterion": row["criterion"], "cic.alpha": f"{row['alpha']:g}",
        "cic.bound": row["bound"], "cic.search": row["search"], "cic.kind": row.get("kind") or "pipeline"})
    gate = CalibrationResult.from_json(row["result_json"]).gate().to_json()
    client.log_text(run.info.run_id, gate, "gate/gate.json")
    stored = {k: v for k, v in row.items() if k in schema.CALIBRATIONS.columns}
    client.log_text(run.info.run_id, schema.canonical_json(stored), "gate/calibration.json")
    client.set_terminated(run.info.run_id, "FINISHED")
    return client.get_run(run.info.run_id)


def _version_of(client: MlflowClient, name: str, gate_id: str) -> Any | None:
    for version in client.search_model_versions(f"name = '{name}'"):
        if version.tags.get(GATE_ID_TAG) == gate_id:
            return version
    return None


def registry_client(uri: str) -> MlflowClient:
    """A client whose model registry is the tracking store itself (a file or server, not Unity Catalog)."""
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def sync_gates(client: MlflowClient, rows: Sequence[dict[str, Any]], *, experiment_prefix: str = "cic") -> list[str]:
    """Register each gate (with its state) and point `live` at the live ones; returns 'name@version' of each."""
    out = []
    for row in rows:
        name = registered_name(row)
        if client.search_registered_models(f"name = '{name}'") == []:
            client.create_registered_model(name, tags={"cic.serving_key": schema.canonical_json(
                {k: row[k] for k in SERVING_KEY})})
        version = _version_of(client, name, row["calibration_id"])
        if version is None:
            run = _gate_run(client, row, experiment_prefix)
            version = client.create_model_version(name, f"{run.info.artifact_uri}/gate", run_id=run.info.run_id,
                                                  tags={GATE_ID_TAG: row["calibration_id"]})
        client.set_model_version_tag(name, version.version, STATE_TAG, row["state"])
        if row["state"] == "live":
            client.set_registered_model_alias(name, LIVE_ALIAS, version.version)
        elif str(client.get_registered_model(name).aliases.get(LIVE_ALIAS)) == str(version.version):
            client.delete_registered_model_alias(name, LIVE_ALIAS)  # retired with no successor: nothing serves
        out.append(f"{name}@{version.version}")
    return out


def registry_sync(db: str, uri: str, gate_ids: Sequence[str], *, experiment_prefix: str = "cic") -> list[str]:
    """Register these gates and every other gate of their serving keys that the store holds as live or retired,
    so the registry's `live` alias and version states match the store."""
    import polars as pl

    from cic.pipeline.gates import gates
    from cic.store import Store
    from tasks.tracking import check_reachable

    check_reachable(uri)
    with Store.open(db, read_only=True, wait_s=300) as store:
        table = gates(store)
    chosen = table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
    keys = chosen.select(SERVING_KEY).unique()
    related = table.join(keys, on=list(SERVING_KEY)).filter(pl.col("state").is_in(["live", "retired"]))
    rows = pl.concat([related, chosen]).unique("calibration_id", keep="first")
    order = rows.sort(pl.col("state") == "live")  # retired first, so the live alias is set last
    return sync_gates(registry_client(uri), order.to_dicts(), experiment_prefix=experiment_prefix)
