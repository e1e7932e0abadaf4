"""System gates (cascades, chosen estimators) in MLflow's model registry, beside single gates and the same way:

    mlflow.artifacts.download_artifacts("models:/<registered name>@live-cp-fixed_sequence-a0p1-d0p05")

One registered model per (system, dataset, criterion), named `cic-system.<slug>.<hash>`; one version per system
gate that serves answers, holding every stage's threshold (in its tags and `gate/system_gate.json`: the models in
order, each stage's estimator and threshold, the route); the alias of each configuration on the live gate's version,
none while the key's gate is flagged, unattainable or retired. The store stays the source of truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mlflow import MlflowClient

from cic import schema
from cic.pipeline.gates.gate_rows import SystemGateRow
from cic.services.mlflow_registry import (
    GATE_ID_TAG,
    KEY_TAG,
    RegistryKind,
    _slug,
    _sync_group,
    registered_gate_models,
)

if TYPE_CHECKING:
    from cic.store import Store

SYSTEM_PREFIX = "cic-system."
SYSTEM_GROUP = ("system", "dataset", "criterion")
SYSTEM_KEY = ("system", "dataset", "criterion", "alpha", "delta", "bound", "search")
ROUTE = ("ask the models in order; the first whose score is <= its threshold answers (a null threshold: that model "
         "never answers); none: abstain")


def system_group_json(row: SystemGateRow) -> str:
    """The (system, dataset, criterion) a registered model holds the gates of, with the system's models."""
    return schema.canonical_json({**{k: row[k] for k in SYSTEM_GROUP}, "models": list(row["models"])})


def system_key_json(row: SystemGateRow) -> str:
    """A system gate's exact serving key as canonical JSON (what its version's tags are checked against)."""
    return schema.canonical_json({k: (float(row[k]) if k in ("alpha", "delta") else row[k]) for k in SYSTEM_KEY}
                                 | {"models": list(row["models"])})


def system_registered_name(row: SystemGateRow) -> str:
    """`cic-system.<system>.<dataset>.<criterion>.<hash of the group>`: readable, and two groups never share it."""
    readable = _slug(f"{row['system']}.{row['dataset']}.{row['criterion']}")
    return f"{SYSTEM_PREFIX}{readable}.{schema.value_hash(system_group_json(row))[:12]}"


def _thresholds(row: SystemGateRow) -> str:
    return json.dumps([None if t is None else float(t) for t in row["thresholds"]])


def _version_tags(row: SystemGateRow) -> dict[str, str]:
    return {GATE_ID_TAG: row["calibration_id"], KEY_TAG: system_key_json(row), "cic.alpha": f"{row['alpha']:g}",
            "cic.delta": f"{row['delta']:g}", "cic.bound": row["bound"], "cic.search": row["search"],
            "cic.models": " -> ".join(row["models"]), "cic.estimators": " / ".join(row["estimators"] or []),
            "cic.thresholds": _thresholds(row)}


def _files(row: SystemGateRow) -> dict[str, str]:
    gate = {"gate_id": row["calibration_id"], **{k: row[k] for k in SYSTEM_KEY}, "kind": row["kind"],
            "models": list(row["models"]), "estimators": list(row["estimators"] or []),
            "thresholds": json.loads(_thresholds(row)), "guarantee": row["guarantee"], "route": ROUTE,
            **{k: row[k] for k in ("bound_value", "n_accepted", "n_errors", "n_cal")},
            "shares": list(row["shares"] or []), "questions": len(row["question_ids"] or [])}
    return {"gate/system_gate.json": schema.canonical_json(gate)}


SYSTEM: RegistryKind[SystemGateRow] = RegistryKind(
    system_registered_name, system_group_json, lambda row: bool(row["certified"]),
    lambda row: {"cic.group_key": system_group_json(row), "cic.system": row["system"], "cic.dataset": row["dataset"],
                 "cic.criterion": row["criterion"], "cic.models": " -> ".join(row["models"])},
    lambda row: (f"Certified system gates of {row['system']} ({' -> '.join(row['models'])}) on {row['dataset']} "
                 f"({row['criterion']}); each version one gate with every stage's threshold, each alias "
                 "live-<bound>-<search>-a<α>-d<δ> the live gate of that configuration."),
    _version_tags, _files, lambda row: set())


def sync_system_gates(client: MlflowClient, rows: Sequence[SystemGateRow], *, experiment_prefix: str,
                      progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Register each serving system gate (with its state) and reconcile each configuration's alias with the
    store; returns 'name@alias' of each live alias."""
    by_group: dict[str, list[SystemGateRow]] = {}
    for row in rows:
        by_group.setdefault(system_group_json(row), []).append(row)
    existing = registered_gate_models(client, SYSTEM_PREFIX) if by_group else {}
    out = []
    for done, group_rows in enumerate(by_group.values(), 1):
        out.extend(_sync_group(client, group_rows, experiment_prefix, existing, SYSTEM))
        if progress is not None:
            progress(done, len(by_group))
    return out


def system_rows_to_sync(store: Store, gate_ids: Sequence[str] | None) -> list[SystemGateRow]:
    """The system gates whose keys these ids touch (every key with a live or retired gate when None): every live
    and retired gate of each such key, and the named gates themselves."""
    import polars as pl

    from cic.pipeline.gates.gate_rows import system_gate_rows
    from cic.pipeline.gates.system_gates import system_gates

    table = system_gates(store)
    if table.is_empty():
        return []
    chosen = table if gate_ids is None else table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
    keys = chosen.select(SYSTEM_KEY).unique()
    related = table.join(keys, on=list(SYSTEM_KEY)).filter(pl.col("state").is_in(["live", "retired"]))
    if gate_ids is not None:
        related = pl.concat([related, chosen]).unique("calibration_id", keep="first")
    return system_gate_rows(related)
