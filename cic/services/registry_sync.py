"""`cic gate sync`, promotion and the nightly pass bring MLflow's registry in line with the store: single gates
(`cic.services.mlflow_registry`) and system gates (`cic.services.mlflow_system_registry`) in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates import SERVING_KEY
from cic.services.mlflow_registry import registry_client, sync_gates
from cic.services.mlflow_system_registry import sync_system_gates, system_rows_to_sync


def registry_sync(db: str, uri: str, gate_ids: Sequence[str] | None, *,
                  experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX,
                  progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Bring the registry in line with the store for the serving keys of these gates (every key that has a live
    or retired gate when `gate_ids` is None): every live and retired gate of each key is registered and the
    key's `live` alias follows the store. Raises when MLflow cannot be reached."""
    import polars as pl

    from cic.pipeline.gate_rows import gate_rows
    from cic.pipeline.gates import gates
    from cic.services.mlflow_setup import check_before_logging
    from cic.services.mlflow_tracking import check_reachable
    from cic.store import Store

    check_reachable(uri)
    check_before_logging(uri)
    with Store.open(db, read_only=True, wait_s=300) as store:
        table = gates(store)
        systems = system_rows_to_sync(store, gate_ids)
    chosen = table if gate_ids is None else table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
    keys = chosen.select(SERVING_KEY).unique()
    related = table.join(keys, on=list(SERVING_KEY)).filter(pl.col("state").is_in(["live", "retired"]))
    if gate_ids is not None:
        related = pl.concat([related, chosen]).unique("calibration_id", keep="first")
    client = registry_client(uri)
    names = sync_gates(client, gate_rows(related), experiment_prefix=experiment_prefix, progress=progress) \
        if related.height else []
    return names + sync_system_gates(client, systems, experiment_prefix=experiment_prefix)
