"""Serving re-verifies a gate's certificate from the store's pairs: intact gates of every kind pass, no pair of
edited fields (nor an edited label underneath) makes a gate serve, labels that came later do not unseat it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.asking import serving_gate
from cic.pipeline.gates.certificates import recertify_all
from cic.pipeline.gates.gate_rows import gate_rows
from cic.pipeline.gates.lifecycle import gates, promote
from cic.pipeline.production.recalibration import WindowRule, recalibrate_group
from cic.store import Store
from tests.pipeline.test_recalibration import make_live, only_group
from tests.support.database import copy_store, raw_sql
from tests.support.pipeline_data import store_run

START = datetime(2026, 1, 1, tzinfo=UTC)
SEARCHES = ("fixed_sequence", "geometric", "bonferroni", "holm")
CONFIG = CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp", "hoeffding"), searches=SEARCHES, n_splits=5)
ASK = dict(model="m", dataset="d", estimator="semantic_entropy", criterion="similarity[0.6]", alpha=0.3, bound="cp",
           search="fixed_sequence")


def live_store(db: Path) -> str:
    """Week 1 calibrated (every search: its first gates live); returns the fixed_sequence cp 0.3 gate's id."""
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=START, estimators=("semantic_entropy",))
        make_live(store, only_group(store), CONFIG)
        return gates(store, alpha=0.3, bound="cp", search="fixed_sequence")["calibration_id"][0]


@pytest.fixture(scope="module")
def live_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`live_store` built once per module: (its folder, the fixed_sequence cp 0.3 gate's id)."""
    folder = tmp_path_factory.mktemp("live")
    return folder, live_store(folder / "g.duckdb")


@pytest.fixture
def live(live_once: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A copy of that store of the test's own (tests edit it): (its path, the gate's id)."""
    copy_store(live_once[0], tmp_path)
    return tmp_path / "g.duckdb", live_once[1]


def test_intact_gates_of_every_search_and_window_recertify(live: tuple[Path, str]) -> None:
    """Pipeline gates (all searches: pilot-split grids too), gates certified together (delta / G) and
    recalibration gates on the newest 150 of a later week all recertify from the store's pairs."""
    db, _ = live
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, seed=1,
                  estimators=("semantic_entropy",))
        result = recalibrate_group(store, only_group(store), CONFIG, WindowRule(count=150))
        store.upsert("calibrations", result.rows)
        store_run(store, dataset="e", n=300, labelled_at=START, seed=2, estimators=("semantic_entropy",))
        make_live(store, only_group(store, "e"), CalibrationConfig(alphas=(0.3,), bounds=("cp",), group_by="dataset",
                                                                  searches=("fixed_sequence",)))
        rows = gate_rows(gates(store))
        assert {r["kind"] for r in rows} == {"pipeline", "recalibration"}
        assert {r["search"] for r in rows} >= set(SEARCHES)
        assert {r["n_cal"] for r in rows if r["kind"] == "recalibration" and r["search"] == "fixed_sequence"} == {150}
        certified = [r for r in rows if r["threshold"] is not None]
        assert len(certified) >= 20
        recertify_all(store, certified)  # raises on the first that fails
    assert serving_gate(str(db), **ASK)["threshold"] is not None


def _edit(db: Path, gate_id: str, **changes: Any) -> None:
    """Change a gate's columns and its result JSON alike, behind the store's back."""
    with Store.open(db, read_only=True) as store:
        row = gates(store, calibration_id=gate_id).row(0, named=True)
    result = json.loads(row["result_json"])
    result.update({k: v for k, v in changes.items() if k in result})
    columns = {k: v for k, v in changes.items() if k in row}
    sets = ", ".join(f"{k} = ?" for k in columns)
    raw_sql(db, f"UPDATE calibrations SET {sets}, result_json = ? WHERE calibration_id = ?",
            params=[*columns.values(), json.dumps(result), gate_id])


EDITS = {
    "threshold in column and JSON (answers everything)": dict(threshold=9.9),
    "threshold nudged up 5% in column and JSON": "nudge",
    "counts and bound in column and JSON": dict(n_errors=0, bound_value=0.001),
    "threshold and counts together": dict(threshold=9.9, n_accepted=400, n_errors=0, bound_value=0.01),
    "level in column and JSON": dict(delta=0.9),
    "window size in the plan": dict(plan_json='{"args":{},"pilot":null,"window":40}'),
}


@pytest.mark.faults
@pytest.mark.parametrize("edit", list(EDITS))
def test_no_pair_of_edited_fields_makes_a_gate_serve(live: tuple[Path, str], tmp_path: Path, edit: str) -> None:
    db, gate_id = live
    before = serving_gate(str(db), **ASK)["threshold"]
    change = EDITS[edit]
    _edit(db, gate_id, **(dict(threshold=before * 1.05) if change == "nudge" else change))
    with pytest.raises(UserError, match=f"stored gate {gate_id[:12]}: .*refusing to serve it"):
        serving_gate(str(db), **ASK)
    out = tmp_path / "gates.json"  # the export serves nothing for that key, says why, and serves the others
    exported = CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    entries = json.loads(out.read_text())
    (refused,) = [e for e in entries if e.get("flagged_gate_id") == gate_id]
    assert refused["serve"] == "nothing" and "refusing to serve it" in refused["reason"]
    assert refused["threshold"] is None and any(e["serve"] == "gate" for e in entries)
    assert before is not None and before < 9.9 / 1.05


@pytest.mark.faults
def test_a_label_edited_underneath_the_gate_stops_it_serving(live: tuple[Path, str]) -> None:
    """Flipping labels in the gate's window by hand (no relabel, so no flag) changes its pairs: refused."""
    db, gate_id = live
    raw_sql(db, "UPDATE labels SET aligned = true WHERE question_id IN "
                "(SELECT question_id FROM labels WHERE NOT aligned ORDER BY question_id LIMIT 5)")
    with pytest.raises(UserError, match=f"{gate_id[:12]}: its calibration pairs are no longer in the store "
                                        r"\(400 rebuilt from its window, 400 certified; their fingerprint differs\)"):
        serving_gate(str(db), **ASK)


def test_labels_stored_after_the_gate_do_not_unseat_it(live: tuple[Path, str]) -> None:
    """Records production saw inside the gate's window but labelled after it was created cannot have been among
    its pairs: the certificate still re-verifies, and a recalibration would use them."""
    db, gate_id = live
    with Store.open(db) as store:
        row = gates(store, calibration_id=gate_id).row(0, named=True)
        inside = row["window_from"] + (row["window_to"] - row["window_from"]) / 2
        key = store_run(store, n=50, labelled_at=datetime.now(UTC), id_offset=5000, seed=3,
                        estimators=("semantic_entropy",))
        late = store.read("labels", run_key=key).filter(pl.col("question_id") >= "q05000")
        store.upsert("observations", late.select("run_key", "question_id", observed_at=pl.lit(inside),
                                                 source=pl.lit("late.csv")))
        assert store.sql("SELECT count(*) FROM observations")[0][0] == 50
    assert serving_gate(str(db), **ASK)["calibration_id"] == gate_id


def test_promote_refuses_a_candidate_whose_certificate_does_not_hold(live: tuple[Path, str]) -> None:
    db, live_id = live
    with Store.open(db) as store:
        store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, seed=1,
                  estimators=("semantic_entropy",))
        result = recalibrate_group(store, only_group(store), CONFIG, WindowRule())
        store.upsert("calibrations", result.rows)
    candidate = result.rows.filter(alpha=0.3, bound="cp", search="fixed_sequence")["calibration_id"][0]
    _edit(db, candidate, threshold=9.9)
    with Store.open(db) as store:
        with pytest.raises(UserError, match=f"stored gate {candidate[:12]}: threshold = 9.9, but its search re-run"):
            promote(store, candidate, reason="test")
        assert gates(store, calibration_id=live_id)["state"][0] == "live"  # nothing changed


@pytest.mark.faults
def test_an_edit_the_rerun_cannot_see_is_caught_by_the_id_being_the_hash_of_the_certificate(
        live: tuple[Path, str]) -> None:
    """A level nudged in the column and the JSON (0.05 → 0.0500001), with the bound's value at that level, re-runs to
    the same threshold, counts and bound, so only the id — the hash of run, level, search and data — can tell the
    row was edited; it does."""
    from cic.stats.bounds import ucb

    db, gate_id = live
    with Store.open(db, read_only=True) as store:
        row = gates(store, calibration_id=gate_id).row(0, named=True)
    delta = row["delta"] * (1 + 2e-6)
    _edit(db, gate_id, delta=delta, bound_value=float(ucb(row["bound"], row["n_errors"], row["n_accepted"], delta)))
    with pytest.raises(UserError, match="its id is not the hash of its run, level, search and data"):
        serving_gate(str(db), **ASK)


@pytest.mark.faults
def test_a_gate_whose_model_was_renamed_serves_nowhere_and_is_named(live: tuple[Path, str], tmp_path: Path) -> None:
    """The id hashes the run, not the model a reader looks a gate up by: a gate of model m renamed to mB (by hand,
    or by `cic import --table calibrations --replace`) would serve m's threshold for mB. It is refused by `cic ask`
    and promotion, and the export serves nothing for mB's key, naming the gate and the model it was certified on,
    while m's other gates still serve."""
    db, gate_id = live
    exported = tmp_path / "calibrations.parquet"
    assert CliRunner().invoke(app, ["export", "calibrations", str(exported), "--db", str(db)]).exit_code == 0
    renamed = pl.read_parquet(exported).with_columns(
        model=pl.when(pl.col("calibration_id") == gate_id).then(pl.lit("mB")).otherwise(pl.col("model")))
    renamed.write_parquet(exported)
    imported = CliRunner().invoke(app, ["import", str(exported), "--db", str(db), "--table", "calibrations",
                                        "--replace"])
    assert imported.exit_code == 0, imported.output
    said = f"stored gate {gate_id[:12]}: model = 'mB', but it was certified on run .* of model 'm'"
    with pytest.raises(UserError, match=said):
        serving_gate(str(db), **{**ASK, "model": "mB"})
    with Store.open(db) as store, pytest.raises(UserError, match=said):
        promote(store, gate_id, reason="test")
    out = tmp_path / "gates.json"
    assert CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)]).exit_code == 0
    entries = json.loads(out.read_text())
    (renamed_key,) = [e for e in entries if e["model"] == "mB"]
    assert renamed_key["serve"] == "nothing" and "model = 'mB'" in renamed_key["reason"]
    assert {e["model"] for e in entries if e["serve"] == "gate"} == {"m"}


def test_a_gate_made_before_todays_rules_that_no_longer_recertifies_says_so_not_edited(
        live: tuple[Path, str], tmp_path: Path) -> None:
    """A store migrated from an older version: a gate whose first event came before the store took today's rules
    and that no longer re-certifies is "certified by an earlier version" with how to re-certify it — never
    "edited" — and withdraws its key alone."""
    db, gate_id = live
    raw_sql(db, "UPDATE schema_version SET applied_at = now() + INTERVAL 1 DAY")  # the rules came after the gate
    _edit(db, gate_id, threshold=9.9)
    with pytest.raises(UserError, match=f"gate {gate_id[:12]} was certified by an earlier version of cic and does "
                                        "not re-certify under today's rules; `cic run` or `cic recalibrate` "
                                        r"re-certifies it") as caught:
        serving_gate(str(db), **ASK)
    assert "edited" not in str(caught.value)
    out = tmp_path / "gates.json"
    assert CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)]).exit_code == 0
    entries = json.loads(out.read_text())
    (refused,) = [e for e in entries if e.get("flagged_gate_id") == gate_id]
    assert "earlier version" in refused["reason"] and "edited" not in refused["reason"]
    assert any(e["serve"] == "gate" for e in entries)
