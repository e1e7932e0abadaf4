"""The statistics core stays light: importing cic must not pull in heavy frameworks."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "sentence_transformers", "prefect", "ray", "mlflow", "duckdb", "polars",
         "pandas", "matplotlib")


def test_import_cic_loads_only_numpy_and_scipy() -> None:
    code = ("import sys; from cic import calibrate, Gate, evaluate_splits, simulate; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"heavy modules imported by cic: {proc.stdout.strip()}"
