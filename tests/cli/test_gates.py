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
    assert sum(1 for line in narrow if "threshold:" in line) == sum(1 for line in wide if "serving" in line.split())


def _cic(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("cic")), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_gate_list_says_the_serving_state_the_export_serves(tmp_path: Path) -> None:
    """A withdrawn gate is `withdrawn` in the list with the export's why and how to restore it; `--state serving`
    lists exactly the gates the export serves; a confirmed gate reads `confirmed` and serves again."""
    import json

    from cic.pipeline.alerts import ERROR_RATE, Alert
    from cic.pipeline.gates import confirm, flag_gates, gates

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        store_run(store, n=400, estimators=("semantic_entropy",))
        make_live(store, groups_of_run(store, store.read("runs").row(0, named=True), estimators=["semantic_entropy"])[0])
        live = gates(store).filter(state="live").sort("alpha", "bound").get_column("calibration_id").to_list()
        flag_gates(store, {live[0]: Alert(ERROR_RATE, "error rate at the live threshold 0.5 is 40/100 (test)")})

    def export() -> dict[str, str]:
        out = tmp_path / "served.json"
        done = _cic(tmp_path, "gate", "export", "--out", str(out), "--db", str(db), "--force")
        assert done.returncode == 0, done.stderr
        return {e["gate_id"] or e["flagged_gate_id"]: e for e in json.loads(out.read_text())
                if e.get("gate_id") or e.get("flagged_gate_id")}

    served = export()
    assert served[live[0]]["state"] == "withdrawn" and served[live[0]]["serve"] == "nothing"
    listed = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "live")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == [live[0][:12], "withdrawn"] for line in listed.stdout.splitlines())
    why = next(line for line in listed.stdout.splitlines() if line.startswith(f"{live[0][:12]} withdrawn since"))
    assert "error rate at the live threshold 0.5 is 40/100" in why and f"cic gate confirm {live[0][:12]}" in why
    assert served[live[0]]["restore"] in why
    serving = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "serving").stdout
    shown = {line.split()[0] for line in serving.splitlines() if line.split() and len(line.split()[0]) == 12}
    assert shown == {g[:12] for g, e in served.items() if e["serve"] == "gate"} and live[0][:12] not in shown
    with Store.open(db) as store:
        confirm(store, live[0], reason="on-call: a labelling glitch")
    assert export()[live[0]]["state"] == "confirmed"
    again = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "serving").stdout
    assert any(line.split()[:2] == [live[0][:12], "confirmed"] for line in again.splitlines())
    bad = _cic(tmp_path, "gate", "list", "--db", str(db), "--state", "flagged")
    assert bad.returncode == 2 and "serving, confirmed, withdrawn" in bad.stderr
