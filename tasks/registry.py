"""Live gates in MLflow's model registry, so a serving system fetches one by name:

    mlflow.artifacts.download_artifacts("models:/<registered name>@live")   # → gate.json

One registered model per serving key (model, dataset, estimator, criterion, alpha, delta, bound, search), named
by a readable slug plus a hash of the exact key (two keys never share a name) and tagged with the key, which is
checked before any alias moves; one version per gate (its run in experiment '<prefix>-gates' holds gate.json
and the stored row); the alias `live` points at the live gate's version, and each version's tag `cic.state`
follows the store. The store stays the source of truth: `cic gate sync` brings the registry in line after an
outage, both ways, idempotently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from mlflow import MlflowClient

from cic import schema
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates import SERVING_KEY
from cic.stats.calibration import CalibrationResult
from tasks.tracking import experiment_id

LIVE_ALIAS = "live"
GATE_ID_TAG = "cic.gate_id"
STATE_TAG = "cic.state"
KEY_TAG = "cic.serving_key"
_SLUG_MAX = 160


class RegistryMismatch(RuntimeError):
    """A registered model or version does not belong to the gate or serving key it was about to serve."""


def serving_key_json(row: dict[str, Any]) -> str:
    """The exact serving key of a gate row as canonical JSON (what the registry's tags are checked against)."""
    return schema.canonical_json({k: (float(row[k]) if k in ("alpha", "delta") else row[k]) for k in SERVING_KEY})


def registered_name(row: dict[str, Any]) -> str:
    """The registered model of a gate's serving key: a readable slug (only letters, digits, '.', '_', '-', so
    it is safe to quote in any search) and a hash of the exact key, so two keys never share a name."""
    readable = (f"{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}.alpha={row['alpha']:g}"
                f".delta={row['delta']:g}.{row['bound']}.{row['search']}")
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", readable)[:_SLUG_MAX]
    return f"cic-gate.{slug}.{schema.value_hash(serving_key_json(row))[:12]}"


def legacy_name(row: dict[str, Any]) -> str:
    """The name earlier versions registered a key under (not injective: only ever cleared, never served)."""
    name = (f"cic-gate.{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}.alpha={row['alpha']:g}"
            f".delta={row['delta']:g}.{row['bound']}.{row['search']}")
    return re.sub(r"[/:]", "_", name)


def _quoted(value: str) -> str:
    """A string literal for an MLflow filter string; only for values cic builds (slugs, hex ids), which hold no
    quote or backslash — anything else is refused rather than spliced into a search."""
    if not re.fullmatch(r"[A-Za-z0-9._=-]+", value):
        raise ValueError(f"{value!r} is not safe in an MLflow search; registry names and gate ids are slugs")
    return f"'{value}'"


def _gate_run(client: MlflowClient, row: dict[str, Any], experiment_prefix: str) -> Any:
    """The run holding the gate's files (created once per gate)."""
    exp = experiment_id(client, f"{experiment_prefix}-gates")
    found = client.search_runs([exp], filter_string=f"tags.`{GATE_ID_TAG}` = {_quoted(row['calibration_id'])}",
                               max_results=1)
    if found:
        return found[0]
    run = client.create_run(exp, run_name=f"gate {row['calibration_id'][:12]}", tags={
        GATE_ID_TAG: row["calibration_id"], "cic.model": row["model"], "cic.dataset": row["dataset"],
        "cic.estimator": row["estimator"], "cic.criterion": row["criterion"], "cic.alpha": f"{row['alpha']:g}",
        "cic.bound": row["bound"], "cic.search": row["search"], "cic.kind": row.get("kind") or "pipeline",
        KEY_TAG: serving_key_json(row)})
    gate = CalibrationResult.from_json(row["result_json"]).gate().to_json()
    client.log_text(run.info.run_id, gate, "gate/gate.json")
    stored = {k: v for k, v in row.items() if k in schema.CALIBRATIONS.columns}
    client.log_text(run.info.run_id, schema.canonical_json(stored), "gate/calibration.json")
    client.set_terminated(run.info.run_id, "FINISHED")
    return client.get_run(run.info.run_id)


def _registered(client: MlflowClient, name: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def _versions(client: MlflowClient, name: str) -> list[Any]:
    return list(client.search_model_versions(f"name = {_quoted(name)}"))


def registry_client(uri: str) -> MlflowClient:
    """A client whose model registry is the tracking store itself (a file or server, not Unity Catalog)."""
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _check_key(model: Any, key: str, name: str) -> None:
    found = (model.tags or {}).get(KEY_TAG)
    if found != key:
        raise RegistryMismatch(f"registered model {name!r} belongs to serving key {found} but was about to serve "
                               f"{key}; nothing was moved — rename or delete that registered model")


def _sync_key(client: MlflowClient, rows: list[dict[str, Any]], experiment_prefix: str) -> list[str]:
    """One serving key: register each gate, tag its state, point `live` at the live gate's version (after checking
    the version's tags name that gate and key) or remove `live` when no gate is live; clear a legacy name's alias."""
    key = serving_key_json(rows[0])
    name = registered_name(rows[0])
    model = _registered(client, name)
    if model is None:
        client.create_registered_model(name, tags={KEY_TAG: key})
        model = client.get_registered_model(name)
    _check_key(model, key, name)
    by_gate = {v.tags.get(GATE_ID_TAG): v for v in _versions(client, name)}
    out, live_version = [], None
    for row in sorted(rows, key=lambda r: r["state"] == "live"):
        version = by_gate.get(row["calibration_id"])
        if version is None:
            run = _gate_run(client, row, experiment_prefix)
            version = client.create_model_version(name, f"{run.info.artifact_uri}/gate", run_id=run.info.run_id,
                                                  tags={GATE_ID_TAG: row["calibration_id"], KEY_TAG: key})
        if version.tags.get(KEY_TAG, key) != key or version.tags.get(GATE_ID_TAG) != row["calibration_id"]:
            raise RegistryMismatch(f"{name} version {version.version} is tagged gate "
                                   f"{version.tags.get(GATE_ID_TAG)!r}, key {version.tags.get(KEY_TAG)!r}, not gate "
                                   f"{row['calibration_id']!r} of {key}; nothing was moved")
        client.set_model_version_tag(name, version.version, STATE_TAG, row["state"])
        if row["state"] == "live":
            live_version = str(version.version)
        out.append(f"{name}@{version.version}")
    current = client.get_registered_model(name).aliases.get(LIVE_ALIAS)
    if live_version is not None and str(current) != live_version:
        client.set_registered_model_alias(name, LIVE_ALIAS, live_version)
    elif live_version is None and current is not None:
        client.delete_registered_model_alias(name, LIVE_ALIAS)  # every gate retired: nothing serves
    legacy = legacy_name(rows[0])
    if legacy != name:
        old = _registered(client, legacy)
        if old is not None and (old.tags or {}).get(KEY_TAG) is not None and LIVE_ALIAS in (old.aliases or {}):
            if json.loads(old.tags[KEY_TAG]) == json.loads(key):
                client.delete_registered_model_alias(legacy, LIVE_ALIAS)  # served from the injective name now
    return out


def sync_gates(client: MlflowClient, rows: Sequence[dict[str, Any]], *,
               experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX) -> list[str]:
    """Register each gate (with its state) and reconcile each serving key's `live` alias with the store: on the
    live gate's version, or absent when none is live; returns 'name@version' of each gate."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(serving_key_json(row), []).append(row)
    out = []
    for key_rows in by_key.values():
        out.extend(_sync_key(client, key_rows, experiment_prefix))
    return out


def registry_sync(db: str, uri: str, gate_ids: Sequence[str] | None, *,
                  experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX) -> list[str]:
    """Bring the registry in line with the store for the serving keys of these gates (every key that has a live
    or retired gate when `gate_ids` is None): every live and retired gate of each key is registered and the
    key's `live` alias follows the store. Raises when MLflow cannot be reached."""
    import polars as pl

    from cic.pipeline.gates import gates
    from cic.store import Store
    from tasks.artifact_locations import check_not_moved
    from tasks.tracking import check_reachable

    check_reachable(uri)
    check_not_moved(uri)
    with Store.open(db, read_only=True, wait_s=300) as store:
        table = gates(store)
    chosen = table if gate_ids is None else table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
    keys = chosen.select(SERVING_KEY).unique()
    related = table.join(keys, on=list(SERVING_KEY)).filter(pl.col("state").is_in(["live", "retired"]))
    if gate_ids is not None:
        related = pl.concat([related, chosen]).unique("calibration_id", keep="first")
    return sync_gates(registry_client(uri), related.to_dicts(), experiment_prefix=experiment_prefix)
