"""System gates in the recalibration pass, as single gates are: a candidate on the questions labelled since the live
gate's own (disjoint), drift per stage and of the system's error rate in Holm with the rest, the anytime-valid
monitor, a failing live system gate withdrawn (it serves nothing, `cic ask` abstains naming why), quiet keys
promoted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cic.pipeline.config import CalibrationConfig, CascadeConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.lifecycle import confirm
from cic.pipeline.gates.serving import live_gate
from cic.pipeline.gates.system_gates import system_gates
from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
from cic.store import Store
from tests.support.pipeline_data import served_systems, store_run

pytestmark = pytest.mark.slow  # nights of recalibration on a store: the slow tier

CONFIG = CalibrationConfig(alphas=(0.2,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4,
                           cascades=(CascadeConfig(name="small-big", models=("small", "big"),
                                                   estimator="semantic_entropy"),))
DAY = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def live(tmp_path: Path) -> tuple[str, list[str], dict]:
    """A weak and a strong model on 600 shared questions, the cascade certified and live."""
    db = str(tmp_path / "t.duckdb")
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=600, seed=1, error_slope=0.9, base=0.05, labelled_at=DAY),
                store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01, labelled_at=DAY)]
    calibrate_store(db, keys, CONFIG)
    with Store.open(db, read_only=True) as store:
        row = system_gates(store, system="small-big").row(0, named=True)
    assert row["state"] == "live" and row["certified"]
    return db, keys, row


def more_traffic(db: str, *, big_base: float, n: int = 400, offset: int = 600, day: int = 2) -> None:
    with Store.open(db) as store:
        store_run(store, model="small", n=n, seed=10 + day, error_slope=0.9, base=0.05, id_offset=offset,
                  labelled_at=DAY + timedelta(days=day))
        store_run(store, model="big", n=n, seed=20 + day, error_slope=0.4, base=big_base, id_offset=offset,
                  labelled_at=DAY + timedelta(days=day))


def one_pass(db: str, keys: list[str], **options: object):
    with Store.open(db) as store:
        return recalibrate_store(store, keys, CONFIG, 0.05, WindowRule(), **options)


def test_a_quiet_week_certifies_the_system_on_the_new_questions_alone_and_promotes_it(live: tuple) -> None:
    db, keys, old = live
    more_traffic(db, big_base=0.01)
    result = one_pass(db, keys, auto_promote=True)
    (candidate,) = result.systems
    assert candidate.row["question_ids"] == [f"q{i:05d}" for i in range(600, 1000)]  # disjoint from the live gate's
    assert candidate.row["certified"] and candidate.alerts == [] and candidate.state == "live"
    assert candidate.row["calibration_id"] in result.promoted and result.withdrawn == {}
    names = [c.test.name for k, c in result.checks if k.model == "small -> big"]
    assert names.count("score_shift") == 2 and names.count("error_rate") == 1  # per stage, and the system's
    (monitor,) = [m for m in result.monitors if m.gate["calibration_id"] == old["calibration_id"]]
    assert monitor.row["n"] > 0 and not monitor.row["alarmed"] and monitor.key.model == "small -> big"
    with Store.open(db, read_only=True) as store:
        states = dict(system_gates(store).select("calibration_id", "state").iter_rows())
        (served,) = served_systems(store)
    assert states[old["calibration_id"]] == "retired" and served["gate_id"] == candidate.row["calibration_id"]
    again = one_pass(db, keys, auto_promote=True)  # nothing new since the new live gate: nothing to certify
    assert again.systems == [] and any("small -> big" in k.model for k, _ in again.skipped)


def test_drift_in_the_second_model_withdraws_the_live_system_gate_and_holds_the_candidate(live: tuple) -> None:
    db, keys, old = live
    more_traffic(db, big_base=0.6)  # the strong model now errs on most questions it answers
    result = one_pass(db, keys, auto_promote=True)
    assert old["calibration_id"] in result.withdrawn
    assert result.withdrawn[old["calibration_id"]].startswith("error rate at the live thresholds")
    (candidate,) = result.systems
    assert candidate.state == "candidate" and candidate.alerts and result.promoted == []
    assert not candidate.row["certified"] and result.replacement_for(old["calibration_id"]) is None  # nothing to
    # promote: the run log says more labelled data may certify one
    with Store.open(db, read_only=True) as store:
        (served,) = served_systems(store)
        assert served["serve"] == "nothing" and served["flagged_gate_id"] == old["calibration_id"]
        asked = live_gate(store, system="small-big", dataset="d", criterion=None, alpha=0.2, bound="cp")
        assert asked.calibration_id == old["calibration_id"] and "is flagged" in asked.withheld  # `cic ask` abstains
        assert asked.withheld == served["reason"]  # in the export's words
    again = one_pass(db, keys, auto_promote=True)  # flagged once: not again, and its monitor stops
    assert again.withdrawn == {} and all(m.gate["calibration_id"] != old["calibration_id"] for m in again.monitors)
    with Store.open(db) as store:
        confirmed = confirm(store, old["calibration_id"], reason="reviewed: the new labels were a bad batch")
        assert confirmed.calibration_id == old["calibration_id"]
        (served,) = served_systems(store)
    assert served["serve"] == "system" and served["gate_id"] == old["calibration_id"]


def test_a_withdrawn_system_gate_whose_candidate_certifies_is_told_to_promote_it(live: tuple) -> None:
    """The strong model now errs above alpha everywhere: the live cascade (which let it answer) is withdrawn, and
    the candidate — the weak model alone answering, the strong one never — certifies; the run log's advice for the
    withdrawn gate names that candidate, as it does for a single gate (it said none certified)."""
    db, keys, old = live
    more_traffic(db, big_base=0.3, n=2000)
    result = one_pass(db, keys)
    (candidate,) = result.systems
    assert old["calibration_id"] in result.withdrawn and candidate.row["certified"]
    assert result.replacement_for(old["calibration_id"]) == candidate.row["calibration_id"]


def test_the_monitor_counts_a_question_once_its_last_stage_is_labelled_and_never_twice(live: tuple) -> None:
    db, keys, old = live

    def monitor() -> dict:
        result = one_pass(db, keys, on_alarm="flag")
        (found,) = [m for m in result.monitors if m.gate["calibration_id"] == old["calibration_id"]]
        return {"n": found.row["n"], "k": found.row["k"], "new": found.new_pairs, "alarmed": found.row["alarmed"],
                "alerts": [m.alert() for m in result.monitor_alarms]}

    more_traffic(db, big_base=0.01, n=50)
    first = monitor()
    with Store.open(db) as store:  # the first stage's labels of 50 more questions; the second's come a day later
        store_run(store, model="small", n=50, seed=7, error_slope=0.9, base=0.05, id_offset=650,
                  labelled_at=DAY + timedelta(days=3))
    assert monitor()["n"] == first["n"]  # not yet a system answer: its last stage is unlabelled
    with Store.open(db) as store:
        store_run(store, model="big", n=50, seed=8, error_slope=0.4, base=0.01, id_offset=650,
                  labelled_at=DAY + timedelta(days=4))
    late = monitor()
    assert late["n"] > first["n"] and late["new"] == late["n"] - first["n"]
    assert monitor()["new"] == 0  # a pass with nothing new counts nothing twice
    more_traffic(db, big_base=0.9, n=600, offset=700, day=5)
    drifted = monitor()
    assert drifted["alarmed"] and any(a.startswith("anytime-valid monitor of live gate "
                                                   f"{old['calibration_id'][:12]} (small -> big")
                                      for a in drifted["alerts"])
    with Store.open(db, read_only=True) as store:  # on_alarm: flag — the alert noted, the gate still serves
        (served,) = served_systems(store)
    assert served["serve"] == "system"


def test_a_system_candidate_counts_only_questions_whose_label_window_has_closed_as_a_single_one_does(
        live: tuple) -> None:
    """400 new questions seen half a day before the pass: with a one-day label window their wrong answers may
    still be labelled late, so neither the cascade nor its models' single keys certify on them — while the live
    system gate's monitor counts every label as it arrives; without a window all 400 make the cascade's
    candidate."""
    db, keys, old = live
    more_traffic(db, big_base=0.01)
    night = DAY + timedelta(days=2, hours=12)
    waiting = one_pass(db, keys, now=night, label_window=timedelta(days=1))
    assert waiting.systems == [] and waiting.candidates == []
    assert any(k.model == "small -> big" and why.startswith("0 new labelled question(s) in every stage since")
               and why.endswith("; 400 more wait for their label window to close") for k, why in waiting.skipped)
    (monitor,) = [m for m in waiting.monitors if m.gate["calibration_id"] == old["calibration_id"]]
    assert monitor.row["n"] > 0
    (candidate,) = one_pass(db, keys, now=night).systems
    assert len(candidate.row["question_ids"]) == 400


def singles_calibrated(tmp_path: Path) -> tuple[str, list[str]]:
    """Two models' runs on 600 shared questions labelled on DAY, calibrated with no cascade configured yet."""
    db = str(tmp_path / "t.duckdb")
    with Store.open(db) as store:
        keys = [store_run(store, model="small", n=600, seed=1, error_slope=0.9, base=0.05, labelled_at=DAY),
                store_run(store, model="big", n=600, seed=2, error_slope=0.4, base=0.01, labelled_at=DAY)]
    calibrate_store(db, keys, CalibrationConfig(alphas=(0.2,), bounds=("cp",), searches=("fixed_sequence",),
                                                n_splits=4))
    return db, keys


def test_a_cascades_first_gate_waits_until_its_questions_label_window_has_closed(tmp_path: Path) -> None:
    """A cascade added after `cic run`, its questions seen half a day before the pass: with a one-day label window
    no first gate yet — one line says why —; a day later its first gates count all 600, and each alpha is its own
    key, as a single key's first candidates are: the reachable one goes live, the unreachable one waits with its
    warning and holds nothing back."""
    db, keys = singles_calibrated(tmp_path)
    with Store.open(db) as store:
        early = recalibrate_store(store, keys, CONFIG, 0.05, WindowRule(), auto_promote=True,
                                  now=DAY + timedelta(hours=12), label_window=timedelta(days=1))
    assert early.systems == []
    (why,) = [w for k, w in early.skipped if k.model == "small -> big"]
    assert why.startswith("cascade small-big: no first gate yet — 600 labelled question(s) of d are within the "
                          "label window")
    with Store.open(db) as store:
        later = recalibrate_store(store, keys, CONFIG.model_copy(update={"alphas": (0.2, 0.001)}), 0.05,
                                  WindowRule(), auto_promote=True, now=DAY + timedelta(days=1, hours=1),
                                  label_window=timedelta(days=1))
    first = {s.row["alpha"]: s for s in later.systems}
    assert first[0.2].state == "live" and len(first[0.2].row["question_ids"]) == 600
    assert first[0.001].state == "candidate" and first[0.001].alerts[0].startswith("alpha is unattainable")


def test_the_nightly_pass_gives_a_configured_cascade_its_first_gate_or_says_why_not(tmp_path: Path) -> None:
    """A cascade added to the config after the runs were calibrated: the nightly pass certifies its first
    candidate on every labelled question (live under `promotion: auto`, as a single key's first gate); a cascade
    whose models have no runs gets one line saying why, every night."""
    db, keys = singles_calibrated(tmp_path)
    ghost = CascadeConfig(name="ghost", models=("small", "absent"), estimator="semantic_entropy")
    config = CONFIG.model_copy(update={"cascades": (*CONFIG.cascades, ghost)})
    with Store.open(db) as store:
        manual = recalibrate_store(store, keys, config, 0.05, WindowRule())
    (first,) = [s for s in manual.systems if s.key.model == "small -> big"]
    assert first.live is None and first.state == "candidate" and first.row["certified"]
    assert len(first.row["question_ids"]) == 600  # every labelled question: nothing spoke for the key before
    (why,) = [w for k, w in manual.skipped if k.model == "small -> absent"]
    assert why.startswith("cascade ghost: no first gate yet — model(s) absent have no run here")
    with Store.open(db) as store:
        auto = recalibrate_store(store, keys, config, 0.05, WindowRule(), auto_promote=True)
    (made,) = [s for s in auto.systems if s.key.model == "small -> big"]
    assert made.state == "live" and made.row["calibration_id"] in auto.promoted
    assert any(r.key.startswith("cascade small-big/d") and r.state == "serving" for r in auto.serving)
    with Store.open(db) as store:  # a key with a gate speaking for it gets no "first" candidate again
        after = recalibrate_store(store, keys, config, 0.05, WindowRule())
    assert not [s for s in after.systems if s.live is None]


def test_a_registered_drift_test_runs_on_every_stage_and_on_the_system(live: tuple) -> None:
    """A team's drift tests (`DRIFT_TESTS`) run on cascades as on single gates: one on the scores per stage, one on
    the questions the live system answers, each named in its sentence."""
    import numpy as np

    from cic.stats.drift import DRIFT_TESTS, DriftRule, DriftTest, answered_error_test

    def mean_up(before: np.ndarray, after: np.ndarray) -> DriftTest:
        return DriftTest("ignored", float(after.mean() - before.mean()), 0.5, before.size, after.size, "mean moved")

    db, keys, _ = live
    more_traffic(db, big_base=0.01)
    DRIFT_TESTS.register(DriftRule("mean_up", "scores", mean_up))
    DRIFT_TESTS.register(DriftRule("strict", "answered", lambda a, e, **k: answered_error_test(a, e, **k)))
    try:
        result = one_pass(db, keys)
    finally:
        DRIFT_TESTS.unregister("mean_up")
        DRIFT_TESTS.unregister("strict")
    tests = [c.test for k, c in result.checks if k.model == "small -> big"]
    names = [t.name for t in tests]
    assert names.count("mean_up") == 2 and names.count("strict") == 1 and names.count("score_shift") == 2
    assert {t.detail for t in tests if t.name == "mean_up"} == {"mean moved — stage 1, small",
                                                               "mean moved — stage 2, big"}
