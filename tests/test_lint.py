"""The code base passes ruff with the project's configuration (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_of_cic_is_longer_than_600_lines() -> None:
    """One job per file: a module past 600 lines holds several (split it along them, as `cic.store.database` was)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "cic"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
