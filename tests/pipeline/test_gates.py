"""Gate states: the pipeline's first gate goes live, later ones wait; promotion retires the live gate of the key;
`cic ask` (serving_gate) and `cic gate export` serve the live gate only; an alerting candidate is never promoted
by policy; stores from before gate states are migrated."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.errors import UserError
from cic.pipeline.gates.asking import serving_gate
from cic.pipeline.gates.lifecycle import gates, promote, retire
from cic.pipeline.production.recalibration import WindowRule, correct_and_alert, promote_quiet, recalibrate_group
from cic.store import Store
from cic.store.database import SCHEMA_VERSION
from tests.pipeline.test_recalibration import CONFIG, make_live, only_group
from tests.support.database import raw_sql
from tests.support.pipeline_data import store_run

START = datetime(2026, 1, 1, tzinfo=UTC)
ASK = dict(model="m", dataset="d", estimator="semantic_entropy", criterion="similarity[0.6]", alpha=0.3, bound="cp",
           search="fixed_sequence")


def two_weeks(db: Path, *, shift: float = 0.0, base: float = 0.02) -> tuple[str, str]:
    """A live gate on week 1 and a recalibration candidate on week 2; returns their ids."""
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=START, estimators=("semantic_entropy",))
        group = only_group(store)
        live = make_live(store, group)["calibration_id"][0]
        store_run(store, n=400, labelled_at=START + timedelta(days=7), id_offset=1000, seed=1, shift=shift, base=base,
                  estimators=("semantic_entropy",))
        result = recalibrate_group(store, group, CONFIG, WindowRule())
        store.upsert("calibrations", result.rows)
        from cic.pipeline.gates.lifecycle import record_candidates

        record_candidates(store, correct_and_alert([result], 0.01), reason="test")
        return live, result.rows["calibration_id"][0]


def test_ask_serves_the_live_gate_until_a_candidate_is_promoted(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    live, candidate = two_weeks(db)
    assert serving_gate(str(db), **ASK)["calibration_id"] == live  # the candidate is newer, but not live
    with Store.open(db) as store:
        promoted, retired = promote(store, candidate[:12], reason="reviewed")
        states = dict(gates(store).select("calibration_id", "state").iter_rows())
    assert promoted["calibration_id"] == candidate and retired == [live]
    assert states == {live: "retired", candidate: "live"}
    assert serving_gate(str(db), **ASK)["calibration_id"] == candidate
    with Store.open(db) as store:
        retire(store, candidate, reason="incident")
    with pytest.raises(UserError, match="no live gate for .*every gate of it was retired"):
        serving_gate(str(db), **ASK)
    with Store.open(db) as store:  # rolling back = promoting the old gate again
        promote(store, live, reason="rollback")
    assert serving_gate(str(db), **ASK)["calibration_id"] == live


def test_a_candidate_with_alerts_needs_a_person_and_the_auto_policy_never_promotes_it(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    live, candidate = two_weeks(db, shift=0.5, base=0.3)  # drift: the week-2 candidate carries alerts
    with Store.open(db) as store:
        row = gates(store, calibration_id=candidate).row(0, named=True)
        assert row["state"] == "candidate" and any("score distribution moved" in a for a in row["alerts"])
        with pytest.raises(UserError, match="was written with alerts .* --despite-alerts"):
            promote(store, candidate, reason="no")
        group = only_group(store)
        result = recalibrate_group(store, group, CONFIG, WindowRule())
        assert promote_quiet(store, [result], correct_and_alert([result], 0.01)) == ([], {})
        assert gates(store, calibration_id=live)["state"][0] == "live"
        promote(store, candidate, reason="reviewed the shift", despite_alerts=True)
        assert row["threshold"] is None  # the drifted week reaches no alpha: the promoted gate serves nothing
        assert gates(store, calibration_id=candidate)["state"][0] == "unattainable"
        assert gates(store, calibration_id=live)["state"][0] == "retired"


def test_the_auto_policy_promotes_a_quiet_group(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    live, candidate = two_weeks(db)
    with Store.open(db) as store:
        result = recalibrate_group(store, only_group(store), CONFIG, WindowRule())
        alerts = correct_and_alert([result], 0.01)
        assert alerts == {candidate: []}
        assert promote_quiet(store, [result], alerts) == ([candidate], {})
        assert dict(gates(store).select("calibration_id", "state").iter_rows()) == {live: "retired",
                                                                                    candidate: "live"}


def test_gate_commands_list_promote_and_export_only_live_gates(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    live, candidate = two_weeks(db)
    listed = CliRunner().invoke(app, ["gate", "list", "--db", str(db), "--state", "candidate"])
    assert listed.exit_code == 0 and candidate[:12] in listed.output and live[:12] not in listed.output
    out = tmp_path / "live.json"
    exported = CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    assert [g["gate_id"] for g in json.loads(out.read_text())] == [live]
    promoted = CliRunner().invoke(app, ["gate", "promote", candidate[:12], "--db", str(db), "--no-mlflow"])
    assert promoted.exit_code == 0 and f"retired {live[:12]}" in promoted.output
    CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(out)])
    assert [g["gate_id"] for g in json.loads(out.read_text())] == [candidate]
    unknown = CliRunner().invoke(app, ["gate", "promote", "ffffffffffff", "--db", str(db), "--no-mlflow"])
    assert unknown.exit_code == 2 and "no stored gate has it" in unknown.output


@pytest.mark.faults
def test_export_refuses_a_live_gate_edited_behind_the_stores_back(tmp_path: Path) -> None:
    """The edited gate's key serves nothing and says why; the export itself goes on (one gate that cannot be
    re-certified withdraws its own key, never the others')."""
    db = tmp_path / "g.duckdb"
    live, _ = two_weeks(db)
    raw_sql(db, f"UPDATE calibrations SET threshold = 0.99 WHERE calibration_id = '{live}'")
    result = CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 0, result.output
    (entry,) = [e for e in json.loads((tmp_path / "x.json").read_text()) if e.get("flagged_gate_id") == live]
    assert entry["serve"] == "nothing" and entry["threshold"] is None and "the row was altered" in entry["reason"]


def test_a_store_from_before_gate_states_serves_what_it_served_before(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    live, candidate = two_weeks(db)
    raw_sql(db, "DROP TABLE gate_events", "DELETE FROM schema_version", "INSERT INTO schema_version VALUES (1, now())",
            f"UPDATE calibrations SET kind = 'pipeline' WHERE calibration_id = '{candidate}'")  # a newer pipeline gate
    with Store.open(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        states = dict(gates(store).select("calibration_id", "state").iter_rows())
    assert states == {live: "candidate", candidate: "live"}  # the newest pipeline gate, as `cic ask` served


def test_live_gates_from_passes_with_different_g_say_what_they_spent_together(tmp_path: Path) -> None:
    """Two datasets certified at once (δ/2 each), then one of them recalibrated alone (δ) and promoted: the live
    family spent 1.5δ. Export states the confidence that is left, promote and list say the family is over budget."""
    from cic.pipeline.gates.lifecycle import live_families, over_budget, record_candidates
    from cic.pipeline.gates.serving import served_entries
    from tests.pipeline.test_recalibration import live_together

    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        live_together(store, ("d", "e"))  # one pass over both datasets: each at delta / 2
        assert over_budget(live_families(store)) == []
        assert all("with probability >= 1 - 0.05 every one" in e["certified_with"] for e in served_entries(store))
        store_run(store, dataset="d", n=400, seed=7, id_offset=1000, labelled_at=START + timedelta(days=7),
                  estimators=("semantic_entropy",))
        alone = recalibrate_group(store, only_group(store, "d"), CONFIG, WindowRule())  # a pass on d alone: delta
        store.upsert("calibrations", alone.rows)
        alerts = correct_and_alert([alone], 0.01)
        record_candidates(store, alerts, reason="test")
        candidate = alone.rows.get_column("calibration_id")[0]
        assert alerts[candidate] == []  # quiet: auto-promotion would take it, but the family would spend 1.5 delta
        promoted, held = promote_quiet(store, [alone], alerts)
        assert promoted == [] and "family over budget: " in held[candidate] and "would spend 0.075" in held[candidate]
        row = gates(store).filter(calibration_id=candidate).row(0, named=True)
        assert row["state"] == "candidate" and row["alerts"] == [held[candidate]]  # flagged: a person decides

    runner = CliRunner()
    promoted = runner.invoke(app, ["gate", "promote", candidate[:12], "--db", str(db), "--no-mlflow",
                                   "--despite-alerts"])
    assert promoted.exit_code == 0, promoted.output
    said = " ".join(promoted.output.split())
    assert "over budget:" in said and "spent 0.075 together (d 0.05, e 0.025), more than delta = 0.05" in said
    listed = runner.invoke(app, ["gate", "list", "--db", str(db)])
    assert listed.exit_code == 0 and "spent 0.075 together" in " ".join(listed.output.split())
    with Store.open(db, read_only=True) as store:
        claims = {e["dataset"]: e["certified_with"] for e in served_entries(store)}
    assert claims["d"].startswith("alone: ") and "1 - 0.05" in claims["d"]
    assert claims["e"].startswith("with the 2 live gates of model 'm' on d, e, this one at delta / 2: with "
                                  "probability >= 1 - 0.075 every one of them is <= alpha at once (more than delta")


@pytest.mark.slow
def test_a_flagged_live_gate_is_exported_serving_nothing_until_a_person_confirms_it(tmp_path: Path) -> None:
    """Export, `cic ask` and the registry agree: a flagged live gate serves nothing until a person confirms it."""
    import polars as pl
    from mlflow import MlflowClient

    from cic.pipeline.production.ingest import ingest_file
    from cic.services.registry_sync import registry_sync
    from tests.pipeline.test_ingest import T0, write
    from tests.pipeline.test_ingest_history import NOW, _stream

    db = tmp_path / "f.duckdb"
    with Store.open(db) as store:
        ingest_file(store, write(_stream(200, 1, T0 - timedelta(days=20)), tmp_path / "week1.parquet"), now=NOW)
        group = only_group(store, "bot")
        live = make_live(store, group.__class__(**{**group.__dict__, "criterion": "human"}))["calibration_id"][0]
        flips = store.read("labels").head(10).select("question_id", (~pl.col("aligned")).alias("correct"))
    write(flips.with_columns(model=pl.lit("qwen"), stream=pl.lit("bot")), tmp_path / "flips.csv")
    write(flips.with_columns(~pl.col("correct"), model=pl.lit("qwen"), stream=pl.lit("bot")), tmp_path / "back.csv")
    runner = CliRunner()
    not_flagged = runner.invoke(app, ["gate", "confirm", live[:12], "--db", str(db), "--no-mlflow"])
    assert not_flagged.exit_code == 2 and "is live and not flagged; nothing to confirm" in not_flagged.output
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    relabelled = runner.invoke(app, ["ingest", str(tmp_path / "flips.csv"), "--db", str(db), "--relabel",
                                     "--tracking-uri", uri])
    assert relabelled.exit_code == 0, relabelled.output
    [version] = MlflowClient(uri).search_model_versions()  # the relabel updated the registry itself: no alias
    assert version.tags["cic.state"] == "withdrawn"
    assert MlflowClient(uri).get_registered_model(version.name).aliases == {}

    exported = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(tmp_path / "a.json")])
    assert exported.exit_code == 0, exported.output
    [entry] = json.loads((tmp_path / "a.json").read_text())
    assert entry["serve"] == "nothing" and entry["gate_id"] is None and entry["flagged_gate_id"] == live
    assert entry["flagged"].startswith("labels changed under this gate: 10 label(s)")
    assert f"cic gate confirm {live[:12]}" in entry["reason"] and "withdrawn, serving nothing" in exported.output
    refused = runner.invoke(app, ["gate", "promote", live[:12], "--db", str(db), "--no-mlflow", "--despite-alerts"])
    assert refused.exit_code == 2 and "cic gate confirm" in refused.output
    key = dict(model="qwen", dataset="bot", estimator=group.estimator, criterion="human", alpha=0.3, bound="cp",
               search="fixed_sequence")
    withheld = serving_gate(str(db), **key)["withheld"]  # `cic ask` abstains, naming why, as the export serves it
    assert withheld.startswith(f"live gate {live[:12]} is flagged") and f"cic gate confirm {live[:12]}" in withheld
    assert registry_sync(str(db), uri, None) == []  # registered, tagged flagged, no alias
    [version] = MlflowClient(uri).search_model_versions()
    assert version.tags["cic.state"] == "withdrawn"
    assert MlflowClient(uri).get_registered_model(version.name).aliases == {}

    changed = runner.invoke(app, ["gate", "confirm", live[:12], "--db", str(db), "--reason", "ana", "--no-mlflow"])
    assert changed.exit_code == 2 and "cannot confirm it" in changed.output  # its labels are not the certified ones
    assert "fingerprint differs" in changed.output
    reverted = runner.invoke(app, ["ingest", str(tmp_path / "back.csv"), "--db", str(db), "--relabel",
                                   "--no-mlflow"])
    assert reverted.exit_code == 0, reverted.output  # the flips were a mistake: the certified labels again
    confirmed = runner.invoke(app, ["gate", "confirm", live[:12], "--db", str(db), "--reason", "ana: flips checked",
                                    "--tracking-uri", uri])
    assert confirmed.exit_code == 0, confirmed.output
    [version] = MlflowClient(uri).search_model_versions()  # the confirm put the alias back itself
    assert MlflowClient(uri).get_registered_model(version.name).aliases == {
        "live-cp-fixed_sequence-a0p3-d0p05": version.version}
    again = runner.invoke(app, ["gate", "export", "--db", str(db), "--out", str(tmp_path / "b.json")])
    assert again.exit_code == 0, again.output
    [served] = json.loads((tmp_path / "b.json").read_text())
    assert served["serve"] == "gate" and served["gate_id"] == live and "flagged" not in served
    assert serving_gate(str(db), **key)["calibration_id"] == live
    [alias] = registry_sync(str(db), uri, None)
    [version] = MlflowClient(uri).search_model_versions()
    assert version.tags["cic.state"] == "confirmed" and alias.endswith("@live-cp-fixed_sequence-a0p3-d0p05")
    with Store.open(db, read_only=True) as store:
        events = store.read("gate_events").filter(calibration_id=live).sort("created_at")
        row = gates(store).filter(calibration_id=live).row(0, named=True)
    assert events["reason"].to_list()[-1].startswith("confirmed: ana: flips checked (was flagged: labels changed")
    assert events.height == 4 and row["state"] == "live" and row["alerts"]  # live, flagged twice, confirmed
    twice = runner.invoke(app, ["gate", "confirm", live[:12], "--db", str(db), "--no-mlflow"])
    assert twice.exit_code == 2 and "not flagged" in twice.output


def test_a_first_gate_that_certifies_nothing_is_unattainable_not_live_until_one_that_does_replaces_it(
        tmp_path: Path) -> None:
    """"Live" means a gate that answers: an unattainable first gate holds its key as `unattainable` — exported as
    serving nothing with why, `cic ask` abstaining with why, never registered — until a gate that certifies
    something is promoted for the key (the unattainable one is then retired)."""
    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.gates.asking import serving_gate
    from cic.pipeline.gates.lifecycle import gates, promote, promote_first_gates
    from cic.pipeline.gates.serving import served_entries
    from cic.pipeline.run.stored_calibration import calibration_rows, groups_of_run
    from cic.stats.limits import ceiling, score_limit, window_limits

    db = tmp_path / "u.duckdb"
    with Store.open(db) as store:
        store_run(store, n=300)
        group = groups_of_run(store, store.read("runs").row(0, named=True))[0]
        pairs = store.calibration_frame(group.model, group.dataset, group.estimator, group.criterion,
                                        run_key=group.run_key, allow_partial=True)
        strict = calibration_rows(group, pairs, CalibrationConfig(alphas=(0.001,), bounds=("cp",)))
        store.upsert("calibrations", strict)
        assert promote_first_gates(store, strict["calibration_id"], reason="pipeline") == []
        first = strict.filter(search="fallback")["calibration_id"][0]
        assert gates(store, calibration_id=first)["state"][0] == "unattainable"
        (entry,) = served_entries(store)
        assert entry["serve"] == "nothing" and entry["unattainable_gate_id"] == first
        assert entry["reason"].startswith("alpha = 0.001 is unattainable") and "(300 labelled" in entry["reason"]
        scores, errors = pairs["score"].to_numpy(), pairs["error"].to_numpy()  # the limits, read back
        assert entry["score_limit"] == score_limit(scores, errors, 0.001)
        assert entry["ceiling"] == ceiling(float(errors.mean()), 0.001)
        assert entry["reason"].endswith(f"; {window_limits(scores, errors, 0.001)}")
    key = dict(model=group.model, dataset=group.dataset, estimator=group.estimator, criterion=group.criterion,
               alpha=0.001, bound="cp", search="fallback")
    assert serving_gate(str(db), **key)["withheld"].startswith("alpha = 0.001 is unattainable")
    with Store.open(db) as store:  # a person promotes another gate of the key: the unattainable one retires
        other = calibration_rows(group, pairs.head(250), CalibrationConfig(alphas=(0.001,), bounds=("cp",)))
        store.upsert("calibrations", other)
        row, retired = promote(store, other.filter(search="fallback")["calibration_id"][0], reason="t")
        assert row["state"] == "unattainable" and retired == [first]  # certifies nothing either: never live


def test_an_event_with_an_unknown_state_stops_the_export_naming_it(tmp_path: Path) -> None:
    """A hand-edited `gate_events` row whose state no version writes: the export refuses in one line naming the
    gate and the state, instead of leaving its key out in silence."""
    db = tmp_path / "g.duckdb"
    live, _ = two_weeks(db)
    raw_sql(db, f"UPDATE gate_events SET state = 'paused' WHERE calibration_id = '{live}'")
    result = CliRunner().invoke(app, ["gate", "export", "--db", str(db), "--out", str(tmp_path / "s.json")])
    assert result.exit_code == 2 and f"gate {live[:12]}: its newest event has state 'paused'" in \
        " ".join(result.output.split()), result.output
    assert not (tmp_path / "s.json").exists()


@pytest.mark.faults
def test_decisions_read_the_events_reason_code_never_its_words(tmp_path: Path) -> None:
    """A live gate whose newest event's sentence reads like a flag but carries no code serves; one whose code says
    flagged serves nothing whatever its words — and a store whose events predate codes gets them once, from the
    markers of their sentences, when it migrates."""
    from cic.pipeline.alerts import MONITOR_ALARM, Alert
    from cic.pipeline.gates.lifecycle import flag_gates
    from cic.pipeline.gates.serving import served_entries

    db = tmp_path / "g.duckdb"
    live, _ = two_weeks(db)
    raw_sql(db, "UPDATE gate_events SET reason = 'flagged: by its words only' WHERE calibration_id = ?",
            params=[live])
    with Store.open(db, read_only=True) as store:
        assert [e["serve"] for e in served_entries(store)] == ["gate"]
    with Store.open(db) as store:
        flag_gates(store, {live: Alert(MONITOR_ALARM, "a monitor alarm")})
    raw_sql(db, "UPDATE gate_events SET reason = 'plain words' WHERE calibration_id = ? AND reason_code = 'flagged'",
            params=[live])
    with Store.open(db, read_only=True) as store:
        assert [e["serve"] for e in served_entries(store)] == ["nothing"]
    raw_sql(db, "UPDATE gate_events SET reason = 'flagged: an alarm', reason_code = NULL",
            "DELETE FROM schema_version", "INSERT INTO schema_version VALUES (5, now() - INTERVAL 1 DAY)")
    with Store.open(db) as store:  # the migration reads the markers once
        assert set(store.read("gate_events").get_column("reason_code")) == {"flagged"}
        assert [e["serve"] for e in served_entries(store)] == ["nothing"]
