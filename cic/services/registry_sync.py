"""`cic gate sync`, promotion and the nightly pass bring MLflow's registry in line with the store: single and system
gates, read, re-certified and registered by one code path (`cic.services.mlflow_registry.sync_gates`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates.lifecycle import KINDS, recertified
from cic.services.mlflow_registry import registry_client, sync_gates

if TYPE_CHECKING:
    from cic.store import Store


def registry_sync(db: str, uri: str, gate_ids: Sequence[str] | None, *,
                  experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX,
                  progress: Callable[[int, int], None] | None = None,
                  refused: dict[str, str] | None = None) -> list[str]:
    """Bring the registry in line with the store for the serving keys of these gates (every key that has a live
    or retired gate when `gate_ids` is None): every live and retired gate of each key is registered and the
    key's `live` alias follows the store. A live gate is re-certified from the store first (the same checks the
    export makes): one that fails is registered as withdrawn and holds no alias (`refused` gets id -> why).
    Raises when MLflow cannot be reached."""
    from cic.services.mlflow_setup import check_before_logging
    from cic.services.mlflow_tracking import check_reachable
    from cic.store import Store

    check_reachable(uri)
    check_before_logging(uri)
    with Store.open(db, read_only=True, wait_s=300) as store:
        rows, why = recertified(store, rows_to_sync(store, gate_ids))
    if refused is not None:
        refused.update(why)
    return sync_gates(registry_client(uri), rows, experiment_prefix=experiment_prefix, progress=progress) \
        if rows else []


def rows_to_sync(store: Store, gate_ids: Sequence[str] | None) -> list[Any]:
    """The gates (of every kind) whose keys these ids touch (every key with a live or retired gate when None):
    every live and retired gate of each such key, and the named gates themselves."""
    import polars as pl

    out = []
    for kind in KINDS:
        table = kind.table(store)
        if table.is_empty():
            continue
        chosen = table if gate_ids is None else table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
        keys = chosen.select(kind.key_columns).unique()
        related = table.join(keys, on=list(kind.key_columns)).filter(
            pl.col("state").is_in(["live", "retired"]))
        if gate_ids is not None:
            related = pl.concat([related, chosen]).unique("calibration_id", keep="first")
        out += kind.typed(related)
    return out


