"""`cic gate list` as a person pipes it: the installed console script in a fresh directory, its width from
$COLUMNS, every value whole (lines break between words, never inside one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cic.pipeline.stored_calibration import groups_of_run
from cic.store import Store
from tests.pipeline.test_recalibration import make_live
from tests.support.pipeline_data import store_run

LONG_ESTIMATOR = "semantic_entropy_weighted[embedding:0.9]"


def _gate_list(db: Path, cwd: Path, columns: str) -> list[str]:
    proc = subprocess.run([str(Path(sys.executable).with_name("cic")), "gate", "list", "--db", str(db)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": columns})
    assert proc.returncode == 0 and not proc.stderr, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_gate_list_piped_fits_columns_and_never_breaks_a_word(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, model="smollm2-135m", dataset="commonsense_qa",
                  estimators=(LONG_ESTIMATOR, "predictive_entropy"), criterion="option_match")
        run = store.read("runs").row(0, named=True)
        for group in groups_of_run(store, run):
            make_live(store, group)
    words = {LONG_ESTIMATOR, "smollm2-135m", "commonsense_qa", "option_match", "fixed_sequence", "predictive_entropy"}
    for columns in ("60", "100", "250"):
        lines = _gate_list(db, tmp_path, columns)
        assert max(map(len, lines)) <= int(columns), (columns, lines[:12])
        printed = set(re.split(r"\s+", "\n".join(lines)))
        assert words <= printed, (columns, words - printed)  # each name whole on one line
        assert "…" not in "\n".join(lines)  # nothing cut either
    wide = _gate_list(db, tmp_path, "250")
    assert any(line.split()[:3] == ["id", "state", "model"] for line in wide)  # room enough: a table
    narrow = _gate_list(db, tmp_path, "100")
    assert not any(line.split()[:2] == ["id", "state"] for line in narrow)  # else one block per gate
    assert sum(1 for line in narrow if "threshold:" in line) == sum(1 for line in wide if "live" in line.split())
