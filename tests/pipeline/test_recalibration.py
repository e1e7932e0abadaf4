"""Recalibration against the live gate: disjoint windows, window rules, drift tests with Holm, alarm rates on a
simulated stream, and gates that are skipped when nothing new arrived."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.gate_rows import gate_rows
from cic.pipeline.gates.lifecycle import promote_first_gates
from cic.pipeline.production.recalibration import (
    GroupRecalibration,
    WindowRule,
    correct_and_alert,
    labelled_pairs,
    parse_since,
    recalibrate_group,
    recalibrate_pairs,
    recalibrate_store,
    span,
)
from cic.pipeline.run.stored_calibration import GroupKey, calibration_rows, groups_of_run
from cic.stats.limits import window_limits
from cic.store import Store
from tests.support.pipeline_data import simulated_pairs, store_run

CONFIG = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("fixed_sequence",), n_splits=5)
START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "t.duckdb") as opened:
        yield opened


def make_live(store: Store, group: GroupKey, config: CalibrationConfig = CONFIG) -> pl.DataFrame:
    """What the pipeline's calibrate stage does: gates on everything labelled so far, the first goes live."""
    pairs = labelled_pairs(store, group)
    rows = calibration_rows(group, pairs.select("question_id", "score", "error"), config, window=span(pairs))
    store.upsert("calibrations", rows)
    promote_first_gates(store, rows.get_column("calibration_id"), reason="test")
    return rows


def only_group(store: Store, dataset: str = "d") -> GroupKey:
    run = store.read("runs", dataset=dataset).row(0, named=True)
    return groups_of_run(store, run, estimators=["semantic_entropy"])[0]


def test_the_new_window_starts_after_the_live_gates_window_and_the_tests_fire(store: Store) -> None:
    store_run(store, n=300, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    live = make_live(store, group)
    # a week later: scores moved up and every answer is wrong
    store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, shift=0.5, base=1.0, seed=1,
              estimators=("semantic_entropy",))
    result = recalibrate_group(store, group, CONFIG, WindowRule())
    row = result.rows.row(0, named=True)
    assert row["n_cal"] == 300 and row["kind"] == "recalibration"  # the new week only: disjoint by construction
    assert row["window_from"] >= START + timedelta(days=7) > live.row(0, named=True)["window_to"]
    assert result.reference == (live["window_from"][0], live["window_to"][0])
    assert sorted(c.test.name for c in result.checks) == ["error_rate", "score_shift"]
    alerts = correct_and_alert([result], level=0.01)[row["calibration_id"]]
    assert alerts[0].startswith("alpha has become unattainable")
    assert any(a.startswith("score distribution moved") for a in alerts)
    # the candidate's copy of the live gate's failing test says whose threshold failed (not the candidate's)
    assert any(a.startswith(f"live gate {live['calibration_id'][0][:12]}: error rate at the live threshold")
               for a in alerts)


def test_window_rules_count_and_since(store: Store) -> None:
    store_run(store, n=100, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    make_live(store, group)
    store_run(store, n=100, labelled_at=START + timedelta(days=3), id_offset=1000, seed=1,
              estimators=("semantic_entropy",))
    store_run(store, n=100, labelled_at=START + timedelta(days=9), id_offset=2000, seed=2,
              estimators=("semantic_entropy",))
    assert recalibrate_group(store, group, CONFIG, WindowRule()).rows["n_cal"][0] == 200
    assert recalibrate_group(store, group, CONFIG, WindowRule(count=50)).rows["n_cal"][0] == 50
    week = WindowRule(since=parse_since("7d"), now=START + timedelta(days=10, hours=12))
    newest = recalibrate_group(store, group, CONFIG, week).rows.row(0, named=True)
    assert newest["n_cal"] == 100 and newest["window_from"] >= START + timedelta(days=9)
    with pytest.raises(UserError, match="since = '7x'"):
        parse_since("7x")
    with pytest.raises(UserError, match="window = 1"):
        WindowRule(count=1)


def test_nothing_new_since_the_live_gate_is_skipped_with_the_reason(store: Store) -> None:
    store_run(store, n=100, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    make_live(store, group)
    result = recalibrate_group(store, group, CONFIG, WindowRule())
    assert result.skipped is not None and result.skipped.startswith("0 new labelled question(s) since the live gate")
    assert result.rows.height == 0 and correct_and_alert([result], 0.01) == {}


def test_without_a_live_gate_the_window_is_all_labelled_data_and_there_is_nothing_to_test(store: Store) -> None:
    store_run(store, n=120, labelled_at=START, estimators=("semantic_entropy",))
    result = recalibrate_group(store, only_group(store), CONFIG, WindowRule(count=100))
    assert result.reference is None and result.checks == [] and result.rows["n_cal"][0] == 100


def _recalibrated_stream(group: GroupKey, i: int, shift: float, store: Store | None = None) -> GroupRecalibration:
    """One simulated stream: 500 labelled questions behind the live gate, then 500 new ones whose scores moved by
    `shift` (uniform scores, SD 0.289), recalibrated with the drift tests corrected (Holm at 0.05). In memory
    (`recalibrate_pairs`, what `recalibrate_group` runs on what it reads); with `store`, also through the store,
    which must give the same tests."""
    week1 = simulated_pairs(n=500, labelled_at=START, seed=2 * i)
    week2 = simulated_pairs(n=500, labelled_at=START + timedelta(days=7), id_offset=1000, seed=2 * i + 1, shift=shift)
    rows = calibration_rows(group, week1.select("question_id", "score", "error"), CONFIG, window=span(week1))
    live = rows.with_columns(state=pl.lit("live"), state_at=pl.lit(None, dtype=pl.Datetime("us", "UTC")),
                             alerts=pl.lit([], dtype=pl.List(pl.String)))
    live = gate_rows(live)
    result = recalibrate_pairs(group, pl.concat([week1, week2]), live, CONFIG, WindowRule())
    correct_and_alert([result], level=0.05)
    if store is not None:
        store_run(store, dataset=group.dataset, n=500, labelled_at=START, seed=2 * i, estimators=(group.estimator,))
        stored = only_group(store, group.dataset)
        make_live(store, stored)
        store_run(store, dataset=group.dataset, n=500, labelled_at=START + timedelta(days=7), id_offset=1000,
                  seed=2 * i + 1, shift=shift, estimators=(group.estimator,))
        through_store = recalibrate_group(store, stored, CONFIG, WindowRule())
        correct_and_alert([through_store], level=0.05)
        assert [(c.test.name, c.test.p_value, c.rejected) for c in through_store.checks] == \
            [(c.test.name, c.test.p_value, c.rejected) for c in result.checks], i
    return result


def _alarm_rate(tmp_path: Path, shift: float, runs: int, through_store: int = 3) -> float:
    """Share of simulated streams whose recalibration raised a drift alert (a test rejected after Holm); the first
    `through_store` streams also go through a DuckDB store."""
    alarms = 0
    with Store.open(tmp_path / f"sim-{shift}.duckdb") as store:
        for i in range(runs):
            group = GroupKey(run_key=f"r{i}", model="m", dataset=f"s{i}", estimator="semantic_entropy",
                             criterion="similarity[0.6]")
            result = _recalibrated_stream(group, i, shift, store if i < through_store else None)
            alarms += any(c.rejected for c in result.checks)
    return alarms / runs


@pytest.mark.slow
def test_drift_alarms_on_a_simulated_stream_fire_on_shift_and_stay_below_the_level_without(tmp_path: Path) -> None:
    runs = 200
    quiet, small, large = (_alarm_rate(tmp_path, shift, n) for shift, n in ((0.0, runs), (0.072, 50), (0.144, runs)))
    print(f"\ndrift alarm rate at level 0.05 (Holm over the KS test and the error-rate test), simulated streams: "
          f"no shift {quiet:.3f} ({runs} runs), 0.25 SD {small:.2f} (50 runs), 0.5 SD {large:.3f} ({runs} runs)")
    assert quiet <= 0.05
    assert large >= 0.9 and small > quiet


def live_together(store: Store, datasets: tuple[str, ...]) -> None:
    """Week-1 runs of model m on these datasets, certified in one pass (each at delta / G) and made live."""
    for i, dataset in enumerate(datasets):
        store_run(store, dataset=dataset, n=400, seed=i, labelled_at=START, estimators=("semantic_entropy",))
        group = only_group(store, dataset)
        pairs = labelled_pairs(store, group)
        rows = calibration_rows(group, pairs.select("question_id", "score", "error"), CONFIG, window=span(pairs),
                                groups=len(datasets))
        store.upsert("calibrations", rows)
        promote_first_gates(store, rows.get_column("calibration_id"), reason="test")


def test_auto_promotion_holds_a_pass_that_would_leave_the_models_family_over_delta(store: Store) -> None:
    """A model's datasets d, e live at delta / 2; a week later d has new labels and a new stream f appears: the
    pass certifies d and f at delta / 3, which beside e's delta / 2 would spend 7/6 delta. Auto-promotion holds
    both, flagged, and the pass alerts (the nightly run fails and a person decides)."""
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.production.recalibration import recalibrate_store

    grouped = CONFIG.model_copy(update={"group_by": "dataset"})
    live_together(store, ("d", "e"))
    week2 = START + timedelta(days=7)
    store_run(store, dataset="d", n=400, seed=7, id_offset=1000, labelled_at=week2, estimators=("semantic_entropy",))
    store_run(store, dataset="f", n=400, seed=8, labelled_at=week2, estimators=("semantic_entropy",))
    out = recalibrate_store(store, store.read("runs").get_column("run_key").to_list(), grouped, 0.01, WindowRule(),
                            auto_promote=True)
    assert out.promoted == [] and [key.dataset for key, _ in out.skipped] == ["e"]
    held = {c.row["dataset"]: a for c, a in out.alerts if a.startswith("family over budget")}
    assert set(held) == {"d", "f"} and all("would spend 0.05833 together (d 0.01667, e 0.025, f 0.01667)" in a
                                           for a in held.values())
    states = gates(store).filter(pl.col("calibration_id").is_in([c.row["calibration_id"] for c in out.candidates]))
    assert set(states["state"]) == {"candidate"} and all(len(a) for a in states["alerts"].to_list())


def _drifted_live_gate(store: Store) -> tuple[GroupKey, str]:
    """A live fixed-sequence gate on week 1, then a week 2 where every answer is wrong."""
    store_run(store, n=300, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    live_id = make_live(store, group).row(0, named=True)["calibration_id"]
    store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, base=1.0, seed=1,
              estimators=("semantic_entropy",))
    return group, live_id


def test_a_live_gate_failing_its_error_rate_test_stops_serving_in_the_same_pass(store: Store) -> None:
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.gates.serving import served_entries

    group, live_id = _drifted_live_gate(store)
    out = recalibrate_store(store, [group.run_key], CONFIG, 0.01, WindowRule())
    assert list(out.withdrawn) == [live_id] and out.withdrawn[live_id].startswith("error rate at the live threshold")
    (entry,) = served_entries(store)
    assert entry["serve"] == "nothing" and entry["flagged_gate_id"] == live_id
    assert "error rate at the live threshold" in entry["reason"]
    row = gates(store).filter(pl.col("calibration_id") == live_id).row(0, named=True)
    assert row["state"] == "live" and any(a.startswith("error rate at the live threshold") for a in row["alerts"])
    again = recalibrate_store(store, [group.run_key], CONFIG, 0.01, WindowRule())  # nothing new: not flagged twice
    assert again.withdrawn == {}


def test_on_alarm_flag_keeps_the_gate_serving_with_the_alert_on_it(store: Store) -> None:
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.gates.serving import served_entries

    group, live_id = _drifted_live_gate(store)
    out = recalibrate_store(store, [group.run_key], CONFIG, 0.01, WindowRule(), on_alarm="flag")
    assert out.withdrawn == {}
    (entry,) = served_entries(store)
    assert entry["serve"] == "gate" and entry["gate_id"] == live_id
    assert gates(store).filter(pl.col("calibration_id") == live_id)["alerts"].list.len()[0] == 1


@pytest.mark.parametrize(("search", "promise"), [("paper", "none"), ("lec", "in expectation only")])
def test_a_search_without_a_guarantee_never_goes_live_on_its_own(store: Store, search: str, promise: str) -> None:
    from cic.errors import UserError
    from cic.pipeline.gates.lifecycle import gates, promote, write_moves
    from cic.pipeline.gates.serving import served_entries

    store_run(store, n=300, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=(search, "fixed_sequence"), n_splits=5)
    rows = make_live(store, group, config)
    states = dict(gates(store).select("search", "state").iter_rows())
    assert states == {search: "candidate", "fixed_sequence": "live"}
    weak_id = rows.filter(pl.col("search") == search)["calibration_id"][0]
    with pytest.raises(UserError, match="no high-probability guarantee") as refused:
        promote(store, weak_id, reason="t")
    assert f"`cic gate promote {weak_id[:12]} --without-guarantee`" in str(refused.value)  # the id, as it runs
    promote(store, weak_id, reason="reviewed by ana", without_guarantee=True)
    entry = next(e for e in served_entries(store) if e["search"] == search)
    assert entry["serve"] == "gate" and entry["guarantee"] == f"{promise}: a person opted in (reviewed by ana)"
    # live by an event that did not opt in (an older store): withheld, and the advised opt-in is recorded
    write_moves(store, [(weak_id, "live", "moved by an older cic", [])])
    assert next(e for e in served_entries(store) if e["search"] == search)["serve"] == "nothing"
    promote(store, weak_id, reason="reviewed again", without_guarantee=True)
    assert next(e for e in served_entries(store) if e["search"] == search)["serve"] == "gate"


def test_auto_promotion_is_held_back_by_a_page_not_by_an_unreachable_alpha_beside_it(store: Store) -> None:
    store_run(store, n=300, labelled_at=START, estimators=("semantic_entropy",))
    group = only_group(store)
    config = CalibrationConfig(alphas=(0.001, 0.3), bounds=("cp",), searches=("fixed_sequence",), n_splits=5)
    first = recalibrate_store(store, [group.run_key], config, 0.01, WindowRule(), auto_promote=True)
    by_alpha = {c.row["alpha"]: c for c in first.candidates}
    assert by_alpha[0.001].alerts[0].startswith("alpha is unattainable")  # a warning: holds back only itself
    pairs = labelled_pairs(store, group)  # why, read back from `cic.stats.limits` on the window's pairs
    assert by_alpha[0.001].alerts[0].endswith(window_limits(pairs["score"].to_numpy(), pairs["error"].to_numpy(),
                                                            0.001))
    assert first.promoted == [by_alpha[0.3].row["calibration_id"]]
    store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, base=1.0, seed=1,
              estimators=("semantic_entropy",))
    second = recalibrate_store(store, [group.run_key], config, 0.01, WindowRule(), auto_promote=True)
    assert second.promoted == [] and any(a.startswith("live gate ") and ": error rate at the live threshold" in a
                                         for _, a in second.alerts)


def test_the_window_rule_takes_only_records_whose_label_window_has_closed(store: Store) -> None:
    """A week after the live gate's window, 300 new labelled answers seen half a day before the pass: with a
    one-day label window they may still be joined by late (wrong) labels, so no candidate is certified on them;
    without one they make the new window."""
    from cic.pipeline.production.recalibration import recalibrate_store

    store_run(store, n=300, labelled_at=START, estimators=("semantic_entropy",))
    make_live(store, only_group(store))
    store_run(store, n=300, labelled_at=START + timedelta(days=7), id_offset=1000, seed=1,
              estimators=("semantic_entropy",))
    keys = store.read("runs").get_column("run_key").to_list()
    night = START + timedelta(days=7, hours=12)
    waiting = recalibrate_store(store, keys, CONFIG, 0.01, WindowRule(), now=night, label_window=timedelta(days=1))
    assert waiting.candidates == [] and any("0 new labelled question(s)" in why and why.endswith(
        "; 300 more wait for their label window to close") for _, why in waiting.skipped)
    counted = recalibrate_store(store, keys, CONFIG, 0.01, WindowRule(), now=night)
    assert [c.row.n_cal for c in counted.candidates] == [300]


def test_a_registered_drift_test_runs_in_every_pass_and_raises_its_own_kind(store: Store) -> None:
    """A team's own drift test is a `DriftRule` and the alert kind naming it — no edit of the recalibration: the
    pass runs it on every live gate, Holm counts it, it withdraws the gate as its kind says and MLflow gets its
    metrics; unregistered, it is not run."""
    from cic.pipeline import alerts
    from cic.services.mlflow_layout import alert_metrics
    from cic.stats.drift import DRIFT_TESTS, DriftRule, answered_error_test

    def strict(answered: object, errors: object, *, alpha: float, where: str) -> object:
        return answered_error_test(answered, errors, alpha=alpha / 2, where=where + " (half alpha)")

    kind = alerts.AlertKind("error rate above half alpha", alerts.PAGE, 8, withdraws=True, test="strict_error_rate")
    DRIFT_TESTS.register(DriftRule("strict_error_rate", "answered", strict))
    alerts.ALERT_KINDS.register(kind)
    try:
        group, live_id = _drifted_live_gate(store)
        out = recalibrate_store(store, [group.run_key], CONFIG, 0.01, WindowRule())
        names = sorted(check.test.name for _, check in out.checks)
        assert names == ["error_rate", "score_shift", "strict_error_rate"]
        (mine,) = [check for _, check in out.checks if check.test.name == "strict_error_rate"]
        assert mine.rejected and mine.live_gate_id == live_id and "(half alpha)" in mine.test.detail
        raised = [a for _, a in out.alerts if alerts.kind_of(a) is kind]
        assert raised and raised[0].startswith(f"live gate {live_id[:12]}: error rate at the live threshold")
        assert live_id in out.withdrawn
        metrics = alert_metrics([a for _, a in out.alerts], alarms=0, checks=[c for _, c in out.checks])
        assert metrics["alerts_error_rate_above_half_alpha"] == 1 and metrics["strict_error_rate_p_value"] < 0.01
    finally:
        alerts.ALERT_KINDS.unregister(kind.name)
        DRIFT_TESTS.unregister("strict_error_rate")
    with pytest.raises(UserError, match="drift test 'x': on = 'labels'; use 'scores' or 'answered'"):
        DriftRule("x", "labels", strict)
