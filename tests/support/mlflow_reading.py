"""Reading a group's MLflow run as a person does: its per-α table and its gates file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from cic.services.mlflow_layout import GATES_FILE, TABLE_FILE


def _artifact_json(client: MlflowClient, run: Any, name: str) -> Any:
    with tempfile.TemporaryDirectory() as out:
        return json.loads(Path(client.download_artifacts(run.info.run_id, name, out)).read_text())


def per_alpha(client: MlflowClient, run: Any) -> Any:
    """The run's per-α table as MLflow's table view reads it (pandas' "split" layout) as a pandas DataFrame.
    (`MlflowClient.load_table` would look the run up through the global tracking URI, not this client's.)"""
    import pandas as pd

    table = _artifact_json(client, run, TABLE_FILE)
    return pd.DataFrame(table["data"], columns=table["columns"])


def gates_logged(client: MlflowClient, run: Any) -> list[dict[str, Any]]:
    """The entries of the run's gates file (α, bound, search, ids and the gate object)."""
    return _artifact_json(client, run, GATES_FILE)["gates"]
