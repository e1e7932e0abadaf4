"""System gates from the store: cascades of stored runs and each model's estimator chosen, certified with the
statistics' own functions on the joined pairs, evaluated on the same splits, stored idempotently."""

from __future__ import annotations

from pathlib import Path

import pytest

from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig, CascadeConfig, parse_config
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.system_gates import SystemSpec, iter_system_data, stored_system_rows, system_calibration_rows
from cic.stats.calibration import calibrate
from cic.stats.cascades import calibrate_cascade
from cic.store import Store
from tests.support.pipeline_data import store_run

ESTIMATORS = ("semantic_entropy[embedding:0.9]", "predictive_entropy")
CONFIG = CalibrationConfig(alphas=(0.1, 0.2), bounds=("cp",), searches=("fallback",), n_splits=8,
                           estimator="auto",
                           cascades=(CascadeConfig(name="small-big", models=("small", "big"),
                                                   estimator="semantic_entropy", costs=(1.0, 5.0)),))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "t.duckdb") as opened:
        yield opened


def two_models(store: Store) -> list[str]:
    """A weak and a strong model on the same 600 questions (ids shared), and a third run on another dataset."""
    return [store_run(store, model="small", n=600, seed=1, error_slope=0.9, base=0.05),
            store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01),
            store_run(store, model="big", dataset="other", n=50, seed=3)]


def test_a_cascade_row_is_calibrate_cascade_on_the_joined_pairs_at_its_share_of_delta(store: Store) -> None:
    keys = two_models(store)
    spec = SystemSpec("small-big", "cascade", ("small", "big"), "semantic_entropy", (1.0, 5.0))
    (data,) = list(iter_system_data(store, keys, spec))  # "other" has no small run: no system there
    assert (data.dataset, data.criterion, list(data.tables)) == ("d", "similarity[0.6]", [ESTIMATORS[0]])
    rows = system_calibration_rows(data, CONFIG)
    pairs = [store.calibration_frame(m, "d", ESTIMATORS[0], "similarity[0.6]") for m in ("small", "big")]
    for row in rows.iter_rows(named=True):
        direct = calibrate_cascade([p.get_column("score").to_numpy() for p in pairs],
                                   [p.get_column("error").to_numpy() for p in pairs], alpha=row["alpha"],
                                   delta=0.05, bound="cp", costs=(1.0, 5.0))
        assert row["thresholds"] == list(direct.thresholds) and row["n_accepted"] == direct.n_accepted
        assert row["shares"] == pytest.approx(direct.shares) and row["cost_per_question"] == direct.cost_per_question
        assert row["certified"] and row["run_keys"] == keys[:2] and row["candidates"] == 1


def test_the_estimator_choice_certifies_each_at_delta_over_k_and_keeps_the_widest(store: Store) -> None:
    keys = two_models(store)
    (data,) = list(iter_system_data(store, keys[1:2], SystemSpec("big:auto", "estimator", ("big",), "auto")))
    rows = system_calibration_rows(data, CONFIG)
    pairs = {e: store.calibration_frame("big", "d", e, "similarity[0.6]") for e in sorted(ESTIMATORS)}
    for row in rows.iter_rows(named=True):
        each = {e: calibrate(p.get_column("score").to_numpy(), p.get_column("error").to_numpy(), alpha=row["alpha"],
                             delta=0.05 / 2, bound="cp") for e, p in pairs.items()}
        best = max(each, key=lambda e: each[e].n_accepted)  # a tie keeps the first in name order
        assert row["estimators"] == [best] and row["thresholds"] == [each[best].threshold]
        assert row["candidates"] == 2 and "2 estimator(s) tried at delta / 2" in row["guarantee"]


def test_the_store_holds_every_system_once_and_a_rerun_adds_nothing(store: Store, tmp_path: Path) -> None:
    keys = two_models(store)
    store.close()
    db = str(tmp_path / "t.duckdb")
    first = calibrate_store(db, keys, CONFIG)
    again = calibrate_store(db, keys, CONFIG)
    # the cascade on d; small:auto on d; big:auto on d and other
    assert (first.systems, first.system_gates) == (again.systems, again.system_gates) == (4, 8)
    with Store.open(db, read_only=True) as reopened:
        calibrations, evaluations = stored_system_rows(reopened), reopened.read("system_evaluations")
    assert calibrations.height == 8 and evaluations.height == 8
    cascade = evaluations.filter(system="small-big")
    assert cascade.get_column("n_splits").to_list() == [8, 8]
    for row in cascade.iter_rows(named=True):
        assert sum(row["shares_mean"]) == pytest.approx(row["coverage_mean"]) and row["chosen_shares"][0] <= 1
        assert row["fdr_mean"] is None or 0 <= row["fdr_mean"] <= 1


@pytest.mark.parametrize(("cascade", "message"), [
    ({"name": "c", "models": ["m", "x"]}, "calibration.cascades.0.models = \\['m', 'x'\\]: 'x' is not a model"),
    ({"name": "m", "models": ["m", "n"]}, "calibration.cascades.0.name = 'm': used twice"),
    ({"name": "c", "models": ["m", "m"]}, "a model twice"),
    ({"name": "c", "models": ["m", "n"], "costs": [1]}, "costs = \\[1.0\\]: one per model \\(2\\)"),
    ({"name": "c", "models": ["m", "n"], "estimator": "eigv"}, "estimator = 'eigv': not among uncertainty"),
    ({"name": "c", "models": ["m"]}, "calibration.cascades.0.models"),
    ({"name": "c", "models": ["m", "n"], "favour": "x"}, "calibration.cascades.0.favour = 'x': not one of its"),
])
def test_a_cascade_that_cannot_be_built_is_refused_naming_the_field(cascade: dict, message: str) -> None:
    data = {"models": [{"name": "m", "spec": "org/m"}, {"name": "n", "spec": "org/n"}],
            "datasets": [{"name": "trivia_qa"}], "uncertainty": {"estimators": ["semantic_entropy"]},
            "calibration": {"cascades": [cascade]}}
    with pytest.raises(UserError, match=message):
        parse_config(data)


def test_a_cascade_whose_stages_share_no_question_is_skipped(store: Store) -> None:
    keys = [store_run(store, model="small", n=50), store_run(store, model="big", n=50, id_offset=1000)]
    spec = SystemSpec("small-big", "cascade", ("small", "big"), "semantic_entropy")
    assert list(iter_system_data(store, keys, spec)) == []


@pytest.fixture(scope="module")
def calibrated_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The two-model store after the pipeline's calibrate step, built once per module: (its folder, its run keys)."""
    folder = tmp_path_factory.mktemp("calibrated")
    with Store.open(folder / "t.duckdb") as store:
        keys = two_models(store)
    calibrate_store(str(folder / "t.duckdb"), keys, CONFIG)
    return folder, keys


@pytest.fixture
def calibrated(calibrated_once: tuple[Path, list[str]], tmp_path: Path) -> tuple[str, list[str]]:
    """A copy of that store of the test's own (tests move gates): (its path, its run keys)."""
    from tests.support.database import copy_store

    folder, keys = calibrated_once
    copy_store(folder, tmp_path)
    return str(tmp_path / "t.duckdb"), keys


def test_a_version_4_store_moves_its_system_gates_into_the_one_gates_table_keeping_ids_states_and_exports(
        calibrated: tuple[str, list[str]]) -> None:
    """Schema version 5 keeps every gate in `calibrations`: a file written by version 4 (system gates in their own
    `system_calibrations` table, `kind` for cascade | estimator) opens with each system gate moved over unchanged —
    same id, same columns, its live state and its export entry the same — and the old table gone."""
    from cic import schema
    from cic.pipeline.gates.serving import served_entries
    from cic.pipeline.gates.system_gates import system_gates
    from cic.store.database import SCHEMA_VERSION
    from tests.support.database import raw_sql

    db, _ = calibrated
    with Store.open(db) as store:
        before, served = system_gates(store).sort("calibration_id"), served_entries(store)
    assert before.height == 8 and before.get_column("state").is_in(["live", "unattainable"]).all()
    old_columns = ", ".join("system_kind AS kind" if c == "system_kind" else c for c in schema.SYSTEM_GATE_COLUMNS)
    added = [c for c in schema.CALIBRATIONS.columns if c not in schema.SINGLE_GATE_COLUMNS]
    raw_sql(Path(db), f"CREATE TABLE system_calibrations AS SELECT {old_columns} FROM calibrations "
            "WHERE system IS NOT NULL", "DELETE FROM calibrations WHERE system IS NOT NULL",
            *(f"ALTER TABLE calibrations DROP COLUMN {c}" for c in added),
            "DELETE FROM schema_version", "INSERT INTO schema_version VALUES (4, now())")
    with pytest.raises(Exception, match="older layout"):
        Store.open(db, read_only=True)
    with Store.open(db) as store:
        assert store.schema_version == SCHEMA_VERSION == 6
        after = system_gates(store).sort("calibration_id")
        assert after.equals(before) and served_entries(store) == served
        tables = {t for (t,) in store.sql("SELECT table_name FROM information_schema.tables")}
        assert "system_calibrations" not in tables and store.count("calibrations", system=None) > 0


def test_each_gate_row_fills_its_own_kinds_columns_and_leaves_the_others_null(
        calibrated: tuple[str, list[str]]) -> None:
    """One table, two shapes (`schema.SINGLE_GATE_COLUMNS`, `SYSTEM_GATE_COLUMNS`): a system gate's model,
    estimator, run, threshold and result are null, and a single gate's stages and system are null."""
    import polars as pl

    from cic import schema

    db, _ = calibrated
    with Store.open(db, read_only=True) as store:
        every = store.read("calibrations")
    systems, singles = every.filter(pl.col("system").is_not_null()), every.filter(pl.col("system").is_null())
    assert systems.height == 8 and singles.height > 0
    only_single = [c for c in schema.SINGLE_GATE_COLUMNS if c not in schema.SYSTEM_GATE_COLUMNS]
    only_system = [c for c in schema.SYSTEM_GATE_COLUMNS if c not in schema.SINGLE_GATE_COLUMNS]
    assert {"model", "threshold", "result_json"} <= set(only_single) and {"models", "thresholds"} <= set(only_system)
    assert systems.select(only_single).null_count().row(0) == (systems.height,) * len(only_single)
    assert singles.select(only_system).null_count().row(0) == (singles.height,) * len(only_system)
    assert singles.get_column("model").null_count() == 0 and systems.get_column("models").null_count() == 0


def test_a_version_4_store_whose_two_gate_tables_share_an_id_is_refused_in_one_line_and_left_unchanged(
        calibrated: tuple[str, list[str]]) -> None:
    """Moving the system gates never drops one unmoved: an id in both old tables (a hand-edited file) stops the
    migration with a line naming it, and the file keeps its version-4 layout and rows."""
    import duckdb

    from cic import schema
    from cic.store.database import StoreError
    from tests.support.database import raw_sql

    db, _ = calibrated
    old_columns = ", ".join("system_kind AS kind" if c == "system_kind" else c for c in schema.SYSTEM_GATE_COLUMNS)
    added = [c for c in schema.CALIBRATIONS.columns if c not in schema.SINGLE_GATE_COLUMNS]
    raw_sql(Path(db), f"CREATE TABLE system_calibrations AS SELECT {old_columns} FROM calibrations "
            "WHERE system IS NOT NULL", "DELETE FROM calibrations WHERE system IS NOT NULL",
            *(f"ALTER TABLE calibrations DROP COLUMN {c}" for c in added),
            "UPDATE system_calibrations SET calibration_id = (SELECT min(calibration_id) FROM calibrations) "
            "WHERE calibration_id = (SELECT min(calibration_id) FROM system_calibrations)",
            "DELETE FROM schema_version", "INSERT INTO schema_version VALUES (4, now())")
    with pytest.raises(StoreError, match=r"calibration_id = '\w+': both a gate and a system gate have it") as refused:
        Store.open(db)
    assert "\n" not in str(refused.value)
    con = duckdb.connect(db, read_only=True)
    try:
        assert con.sql("SELECT max(version) FROM schema_version").fetchall() == [(4,)]
        assert con.sql("SELECT count(*) FROM system_calibrations").fetchall() == [(8,)]
        assert "system" not in {c for (c,) in con.sql("SELECT column_name FROM information_schema.columns WHERE "
                                                      "table_name = 'calibrations'").fetchall()}
    finally:
        con.close()


def test_the_results_show_each_system_gate_with_its_protocol_and_only_for_these_runs(
        calibrated: tuple[str, list[str]]) -> None:
    from cic.pipeline.gates.system_gates import system_results

    db, keys = calibrated
    with Store.open(db, read_only=True) as reopened:
        rows = system_results(reopened, keys)
        assert system_results(reopened, ["elsewhere"]) == []
    assert {r.system for r in rows} == {"small-big", "small:auto", "big:auto"} and len(rows) == 8
    cascade = [r for r in rows if r.system == "small-big"]
    assert [r.alpha for r in cascade] == [0.1, 0.2] and all(r.n_splits == 8 for r in cascade)
    assert all(r.certified == bool(r.estimators) for r in rows)


def test_the_export_serves_each_system_keys_newest_gate_or_nothing_and_filters_by_model(
        calibrated: tuple[str, list[str]]) -> None:
    from tests.support.pipeline_data import served_systems

    db, _ = calibrated
    with Store.open(db, read_only=True) as reopened:
        entries = served_systems(reopened)
        small = served_systems(reopened, model="small")
        other = served_systems(reopened, dataset="other")
        stored = stored_system_rows(reopened)
    assert len(entries) == stored.height == 8  # one per key: a rerun's identical rows are the same rows
    assert {e["system"] for e in small} == {"small-big", "small:auto"} and {e["dataset"] for e in other} == {"other"}
    for entry in entries:
        row = stored.filter(calibration_id=entry["gate_id"] or entry["unattainable_gate_id"]).row(0, named=True)
        if row["certified"]:
            assert entry["serve"] == "system" and entry["thresholds"] == row["thresholds"]
        else:
            assert entry["serve"] == "nothing" and "unattainable" in entry["reason"]


def test_the_prefect_digest_shows_each_system_gate_beside_the_single_models(calibrated: tuple[str, list[str]]) -> None:
    from cic.pipeline.gates.system_gates import system_results
    from cic.pipeline.run.run_digest import SYSTEM_COLUMNS, markdown_summary
    from cic.pipeline.run.run_results import PipelineSummary

    db, keys = calibrated
    with Store.open(db, read_only=True) as reopened:
        rows = system_results(reopened, keys)
    shown = markdown_summary(PipelineSummary(db=db, tracking_uri="", report_dir="", systems=rows))
    assert "| " + " | ".join(SYSTEM_COLUMNS) + " |" in shown
    cascade = [line for line in shown.splitlines() if line.startswith("| small-big | d · similarity[0.6] |")]
    assert len(cascade) == 2 and all("≤" in line or "certifies nothing" in line for line in cascade)
    assert markdown_summary(PipelineSummary(db=db, tracking_uri="", report_dir="")).count("Systems —") == 0


def test_a_systems_first_gate_goes_live_later_ones_wait_for_promotion_as_single_gates_do(
        calibrated: tuple[str, list[str]]) -> None:
    from cic.pipeline.gates.lifecycle import find_gate, promote
    from cic.pipeline.gates.system_gates import system_gates
    from tests.support.pipeline_data import served_systems

    db, keys = calibrated
    with Store.open(db) as store:
        first = system_gates(store, system="small-big")
        assert set(first.get_column("state")) <= {"live", "unattainable"} and first.height == 2
        served = {e["alpha"]: e for e in served_systems(store) if e["system"] == "small-big"}
        for model, seed in (("small", 11), ("big", 12)):  # more labelled traffic on the same runs: new data
            store_run(store, model=model, n=200, seed=seed, id_offset=600)
    calibrate_store(db, keys, CONFIG)
    with Store.open(db) as store:
        every = system_gates(store, system="small-big")
        new = every.filter(state="candidate")
        assert every.height == 4 and new.height == 2  # the keys were spoken for: the new gates wait
        assert {e["alpha"]: e["gate_id"] for e in served_systems(store) if e["system"] == "small-big"} == \
            {a: e["gate_id"] for a, e in served.items()}
        row = find_gate(store, new.filter(alpha=0.2).get_column("calibration_id")[0][:12])  # the one lifecycle
        assert row.is_system
        promoted, retired = promote(store, row.calibration_id[:12], reason="reviewed")
        assert promoted.state in ("live", "unattainable")
        now = {e["alpha"]: e for e in served_systems(store) if e["system"] == "small-big"}
    assert retired == [served[0.2]["gate_id"] or served[0.2]["unattainable_gate_id"]]
    assert (now[0.2]["gate_id"] or now[0.2]["unattainable_gate_id"]) == row["calibration_id"]
    assert now[0.1] == served[0.1] or now[0.1]["gate_id"] == served[0.1]["gate_id"]


def test_a_system_gate_goes_through_the_single_gates_lifecycle_retire_promote_and_its_refusals(
        calibrated: tuple[str, list[str]]) -> None:
    """One lifecycle: `retire`, `promote`, `confirm` and `find_gate` take a system gate's id as a single gate's —
    retired, its key serves nothing (the export says so); promoted back, it serves; a live, unflagged gate has
    nothing to confirm; an edited row is refused by the same `verify`."""
    from cic.pipeline.gates.gate_rows import GateRow
    from cic.pipeline.gates.lifecycle import confirm, find_gate, promote, retire, verify
    from cic.pipeline.gates.system_gates import system_gates
    from tests.support.pipeline_data import served_systems

    db, _ = calibrated
    with Store.open(db) as store:
        live = system_gates(store, system="small-big").filter(state="live")
        gate_id = live.get_column("calibration_id")[0]
        assert retire(store, gate_id[:12], reason="incident 7").state == "retired"
        (entry,) = [e for e in served_systems(store) if e["system"] == "small-big"
                    and e["alpha"] == live.get_column("alpha")[0]]
        assert entry["serve"] == "nothing" and entry["retired_gate_id"] == gate_id
        row, retired = promote(store, gate_id, reason="back after review")
        assert row.state == "live" and retired == []
        assert any(e["gate_id"] == gate_id for e in served_systems(store))
        with pytest.raises(UserError, match="system gate .* is live and not flagged; nothing to confirm"):
            confirm(store, gate_id, reason="x")
        edited = find_gate(store, gate_id)
        with pytest.raises(UserError, match="column thresholds"):
            verify(store, GateRow(**{**edited.columns(), "thresholds": [0.0 for _ in edited.thresholds]}))


def test_no_lifecycle_move_has_a_system_twin() -> None:
    """find, promote, confirm, retire, verify and the first gates exist once for both kinds of gate; a gate is one
    type (`GateRow`) stored in one table (`calibrations`)."""
    import ast

    from cic import schema

    package = Path(__file__).resolve().parents[2] / "cic"
    nodes = [node for file in package.rglob("*.py") for node in ast.walk(ast.parse(file.read_text()))]
    names = {node.name for node in nodes if isinstance(node, ast.FunctionDef)}
    twins = {n for n in names for move in ("find", "promote", "confirm", "retire", "verify", "promote_first")
             if n.startswith(f"{move}_system") or n == f"{move}_systems"}
    assert not twins, twins
    assert {node.name for node in nodes if isinstance(node, ast.ClassDef) and node.name.endswith("GateRow")} == \
        {"GateRow"}
    assert [t for t in schema.TABLES if t.endswith("calibrations")] == ["calibrations"]


def test_the_export_says_why_a_key_serves_nothing_in_the_same_fields_and_words_for_both_kinds(
        calibrated: tuple[str, list[str]]) -> None:
    """One export path over both kinds: a withdrawn (flagged) and a retired gate's entries carry the same fields and
    the same sentence for a model's gate and a system's — only the noun, the id and the key columns differ — and
    `live_gate` returns the withdrawn gate of either kind with the export's reason (`cic ask` abstains naming it)."""
    import polars as pl

    from cic.pipeline.alerts import ERROR_RATE, Alert
    from cic.pipeline.gates.lifecycle import SERVING_KEY, flag_gates, gates, retire
    from cic.pipeline.gates.serving import live_gate, served_entries
    from cic.pipeline.gates.system_gates import SYSTEM_KEY, system_gates

    db, _ = calibrated
    with Store.open(db) as store:
        one = gates(store).filter(pl.col("state") == "live", pl.col("threshold").is_not_null()).row(0, named=True)
        system = system_gates(store, system="small-big").filter(state="live", certified=True).row(0, named=True)
        ids = (one["calibration_id"], system["calibration_id"])
        flag_gates(store, {gid: Alert(ERROR_RATE, "error rate at the live thresholds rose (test)") for gid in ids})
        flagged = {e["flagged_gate_id"]: e for e in served_entries(store) if e.get("flagged_gate_id")}
        asked = (live_gate(store, **{k: one[k] for k in SERVING_KEY if k != "delta"}),
                 live_gate(store, **{k: system[k] for k in SYSTEM_KEY if k != "search"}))
        for gid in ids:
            retire(store, gid, reason="incident 7")
        retired = {e["retired_gate_id"]: e for e in served_entries(store) if e.get("retired_gate_id")}
    own = ({*SERVING_KEY, "threshold"}, {*SYSTEM_KEY, "system_kind", "models", "delta", "thresholds"})
    for entries in (flagged, retired):
        single, cascade = entries[ids[0]], entries[ids[1]]
        assert single["serve"] == cascade["serve"] == "nothing"
        assert set(single) - own[0] == set(cascade) - own[1]
        words = [e["reason"].replace(gid[:12], "ID").replace("live system gate", "live gate")
                 for e, gid in ((single, ids[0]), (cascade, ids[1]))]
        assert words[0] == words[1]
    for row, gid in zip(asked, ids, strict=True):
        assert row.calibration_id == gid and row.withheld == flagged[gid]["reason"]


def test_promote_many_takes_single_and_system_gates_in_one_transaction_or_neither(
        calibrated: tuple[str, list[str]]) -> None:
    """The policy's promotion (`promote_many`, used by `promotion: auto`) is the one lifecycle move for both kinds:
    a single and a system candidate promoted together retire the gates that spoke for their keys; with an alerting
    gate among them nothing is written."""
    import polars as pl

    from cic.pipeline.gates.lifecycle import flag_gates, gates, promote_many
    from cic.pipeline.gates.system_gates import system_gates

    db, keys = calibrated
    with Store.open(db) as store:
        for model, seed in (("small", 11), ("big", 12)):  # more labelled traffic on the same runs: new candidates
            store_run(store, model=model, n=200, seed=seed, id_offset=600)
    calibrate_store(db, keys, CONFIG)
    with Store.open(db) as store:
        single = gates(store).filter(pl.col("state") == "candidate", pl.col("threshold").is_not_null()
                                     ).row(0, named=True)
        system = system_gates(store, system="small-big").filter(state="candidate", certified=True).row(0, named=True)
        before = {r["calibration_id"] for r in [*gates(store).filter(state="live").iter_rows(named=True),
                                                 *system_gates(store).filter(state="live").iter_rows(named=True)]}
        ids = [single["calibration_id"], system["calibration_id"]]
        flag_gates(store, {ids[1]: "error rate (test)"})
        with pytest.raises(UserError, match="written with alerts"):
            promote_many(store, ids, reason="x")
        assert {r["calibration_id"] for r in gates(store).filter(state="live").iter_rows(named=True)} <= before
    calibrate_store(db, keys, CONFIG)  # a rerun: the same rows, the flag stays on the system candidate
    with Store.open(db) as store:
        other = system_gates(store, system="small-big").filter(
            pl.col("state") == "candidate", pl.col("certified"), pl.col("calibration_id") != ids[1]).row(0, named=True)
        promoted = promote_many(store, [ids[0], other["calibration_id"]], reason="reviewed together")
        states = {**dict(gates(store).select("calibration_id", "state").iter_rows()),
                  **dict(system_gates(store).select("calibration_id", "state").iter_rows())}
    assert promoted == [ids[0], other["calibration_id"]]
    assert states[ids[0]] == states[other["calibration_id"]] == "live"
    assert any(states[gid] == "retired" for gid in before)


def test_an_event_log_state_no_cic_writes_stops_the_export_for_a_system_gate_as_for_a_single_one(
        calibrated: tuple[str, list[str]]) -> None:
    """A system key must not vanish from the export in silence either: a newest event whose state no version of cic
    writes (gate_events edited by hand) is refused naming the gate, and nothing is served from a guess."""
    from cic.pipeline.gates.serving import served_entries
    from cic.pipeline.gates.system_gates import system_gates
    from tests.support.database import raw_sql

    db, _ = calibrated
    with Store.open(db, read_only=True) as store:
        gate_id = system_gates(store, system="small-big").filter(state="live").get_column("calibration_id")[0]
    raw_sql(Path(db), f"UPDATE gate_events SET state = 'paused' WHERE calibration_id = '{gate_id}'")
    with Store.open(db, read_only=True) as store:
        with pytest.raises(UserError, match=f"gate {gate_id[:12]}: its newest event has state 'paused'"):
            served_entries(store)
        assert all("system" not in e for e in served_entries(store, model="nobody"))  # a filter that leaves it out


def test_a_favoured_cascade_is_certified_with_its_favourite_and_re_certifies_from_its_own_row(store: Store) -> None:
    """`favour: big` stores the favoured model with the gate (in its id, its guarantee and its row), certifies as
    `calibrate_cascade(favour="big")` does on the joined pairs, and re-certifies from the stored row alone."""
    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.system_gates import recertify_system, spec_of
    from cic.stats.cascades import FAVOUR_SHARE

    keys = two_models(store)
    spec = SystemSpec("small-big", "cascade", ("small", "big"), "semantic_entropy", (1.0, 5.0), favour="big")
    (data,) = list(iter_system_data(store, keys, spec))
    rows = system_calibration_rows(data, CONFIG)
    unfavoured = system_calibration_rows(next(iter(iter_system_data(store, keys, SystemSpec(
        "small-big", "cascade", ("small", "big"), "semantic_entropy", (1.0, 5.0))))), CONFIG)
    pairs = [store.calibration_frame(m, "d", ESTIMATORS[0], "similarity[0.6]") for m in ("small", "big")]
    for row, other in zip(rows.iter_rows(named=True), unfavoured.iter_rows(named=True), strict=True):
        direct = calibrate_cascade([p.get_column("score").to_numpy() for p in pairs],
                                   [p.get_column("error").to_numpy() for p in pairs], alpha=row["alpha"],
                                   delta=0.05, bound="cp", costs=(1.0, 5.0), favour="big", models=("small", "big"))
        assert row["thresholds"] == list(direct.thresholds) and row["favour"] == "big"
        assert row["calibration_id"] != other["calibration_id"] and other["favour"] is None
        assert f"big alone at {FAVOUR_SHARE:g} of delta" in row["guarantee"]
    store.upsert("calibrations", rows)
    (stored,) = gate_rows(stored_system_rows(store).filter(calibration_id=rows["calibration_id"][0]))
    assert spec_of(stored).favour == "big"
    recertify_system(store, stored)  # from its own row: no config


def test_an_estimator_choice_with_a_prior_from_other_datasets_shares_delta_by_it_and_re_certifies_from_its_row(
        tmp_path: Path) -> None:
    """`estimator_prior: other_datasets`: big:auto on d ranks its estimators by their gates on `other` (and the
    reverse), certifies each at its share (0.7, 0.3 of delta for two), says so in the guarantee, and re-certifies
    from its own row even after the other dataset's gates change; without the key, the gates are as before."""
    import json

    import numpy as np
    import polars as pl

    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.system_gates import recertify_system
    from cic.stats.estimator_prior import prior_shares
    from cic.store.queries import past_coverage

    db = tmp_path / "p.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01),
                store_run(store, model="big", dataset="other", n=600, seed=3, error_slope=0.4, base=0.01)]
        noise = store.read("scores", run_key=keys[1], estimator="predictive_entropy")  # uninformative on other
        store.upsert("scores", noise.with_columns(value=pl.Series(np.random.default_rng(0).random(noise.height))))
    config = CalibrationConfig(alphas=(0.1, 0.2), bounds=("cp",), searches=("fallback",), n_splits=4,
                               estimator="auto", estimator_prior="other_datasets")
    calibrate_store(str(db), keys, config)
    with Store.open(db) as store:
        rows = stored_system_rows(store).filter(system="big:auto", dataset="d")
        past = past_coverage(store, "big", "d", "similarity[0.6]", sorted(ESTIMATORS), "fallback")
        assert set(past) == set(ESTIMATORS) and len(set(past.values())) == 2  # other's gates rank the two
        others = store.read("calibrations").filter(pl.col("system").is_null() & (pl.col("dataset") == "other")
                                                   & (pl.col("search") == "fallback"))
        assert past == pytest.approx({e: float((g["n_accepted"] / g["n_cal"]).mean())  # never d's own labels
                                      for (e,), g in others.group_by("estimator")})
        shares = prior_shares(sorted(ESTIMATORS), past, 0.05)
        pairs = {e: store.calibration_frame("big", "d", e, "similarity[0.6]") for e in sorted(ESTIMATORS)}
        for row in rows.iter_rows(named=True):
            assert json.loads(row["prior"]) == pytest.approx(past)
            each = {e: calibrate(p.get_column("score").to_numpy(), p.get_column("error").to_numpy(),
                                 alpha=row["alpha"], delta=shares[e], bound="cp") for e, p in pairs.items()}
            best = max(each, key=lambda e: each[e].n_accepted)
            assert row["estimators"] == [best] and row["thresholds"] == [each[best].threshold]
            assert "ranked on other data" in row["guarantee"] and "independent of these" in row["guarantee"]
        store.upsert("labels", store.read("labels", run_key=keys[1]).with_columns(aligned=False))  # other changes
        for stored in gate_rows(rows):
            recertify_system(store, stored)  # the prior is the row's, not the store's today
    plain = CalibrationConfig(alphas=(0.1, 0.2), bounds=("cp",), searches=("fallback",), n_splits=4,
                              estimator="auto")
    with Store.open(db) as store:
        (data,) = [d for d in iter_system_data(store, keys, SystemSpec("big:auto", "estimator", ("big",), "auto"))
                   if d.dataset == "d"]
    before = system_calibration_rows(data, plain)
    assert before["prior"].null_count() == before.height
    assert set(before["calibration_id"]).isdisjoint(rows["calibration_id"])
    assert all(g.endswith("2 estimator(s) tried at delta / 2 and the one answering the most kept; fallback search; "
                          "exchangeable questions") for g in before["guarantee"])


def test_a_prior_without_an_estimator_choice_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="estimator_prior = 'other_datasets' ranks the estimators"):
        CalibrationConfig(estimator_prior="other_datasets")
    assert CalibrationConfig(estimator="auto", estimator_prior="other_datasets").estimator_prior == "other_datasets"
