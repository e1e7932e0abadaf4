"""`cic gate sync`, promotion and the nightly pass bring MLflow's registry in line with the store: single gates
(`cic.services.mlflow_registry`) and system gates (`cic.services.mlflow_system_registry`) in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from cic.errors import UserError
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates.gate_rows import GateRow, SystemGateRow
from cic.pipeline.gates.lifecycle import SERVING_KEY, verify
from cic.pipeline.gates.serving_state import FLAGGED, serving_state
from cic.services.mlflow_registry import registry_client, sync_gates
from cic.services.mlflow_system_registry import sync_system_gates, system_rows_to_sync

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
    import polars as pl

    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.lifecycle import gates
    from cic.services.mlflow_setup import check_before_logging
    from cic.services.mlflow_tracking import check_reachable
    from cic.store import Store

    check_reachable(uri)
    check_before_logging(uri)
    with Store.open(db, read_only=True, wait_s=300) as store:
        table = gates(store)
        chosen = table if gate_ids is None else table.filter(pl.col("calibration_id").is_in(list(gate_ids)))
        keys = chosen.select(SERVING_KEY).unique()
        related = table.join(keys, on=list(SERVING_KEY)).filter(pl.col("state").is_in(["live", "retired"]))
        if gate_ids is not None:
            related = pl.concat([related, chosen]).unique("calibration_id", keep="first")
        singles = gate_rows(related)
        rows, why = recertified(store, singles, verify if not all_recertify(store, singles) else verify_row)
        systems, system_why = recertified(store, system_rows_to_sync(store, gate_ids), verify)
    if refused is not None:
        refused.update({**why, **system_why})
    client = registry_client(uri)
    names = sync_gates(client, rows, experiment_prefix=experiment_prefix, progress=progress) if rows else []
    return names + sync_system_gates(client, systems, experiment_prefix=experiment_prefix)


Row = TypeVar("Row", GateRow, SystemGateRow)


def recertified(store: Store, rows: Sequence[Row], verify: Callable[[Store, Row], None]
                ) -> tuple[list[Row], dict[str, str]]:
    """The rows with every serving one that fails re-certification marked withdrawn in memory (the registry then
    tags it so and gives it no alias; the store is not written), and id -> why for those."""
    out, why = [], {}
    for row in rows:
        if serving_state(row).serves:
            try:
                verify(store, row)
            except UserError as exc:
                why[row["calibration_id"]] = str(exc)
                row = replace(row, reason=f"{FLAGGED}not re-certified: {exc}")
        out.append(row)
    return out, why


def all_recertify(store: Store, rows: Sequence[GateRow]) -> bool:
    """Whether every serving gate re-certifies, the pairs of all their runs read in one query (the common case);
    when one does not, each is checked alone to name it."""
    from cic.pipeline.gates.certificates import recertify_all
    from cic.pipeline.gates.lifecycle import verify_gate

    serving = [r for r in rows if serving_state(r).serves]
    try:
        for row in serving:
            verify_gate(row)
        recertify_all(store, serving)
    except UserError:
        return False
    return True


def verify_row(store: Store, row: GateRow) -> None:
    """Nothing left to check: `all_recertify` re-certified every serving gate at once."""
