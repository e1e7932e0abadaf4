"""Each recalibration pass updates the anytime-valid monitor of every live gate, in DuckDB: every labelled pair
counts once, a quiet gate stays quiet night after night, a gate whose answered questions go wrong alarms and the
alarm names the gate, the evidence and the nights since it went live."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
from cic.store import Store
from tests.pipeline.test_recalibration import CONFIG, make_live, only_group
from tests.support.pipeline_data import store_run

START = datetime(2026, 1, 1, tzinfo=UTC)


def nightly(db: Path, *, nights: int, base: float) -> list:
    """A live gate on week 1, then `nights` recalibration passes, each after 100 new labelled questions."""
    with Store.open(db) as store:
        store_run(store, n=400, labelled_at=START, estimators=("semantic_entropy",))
        make_live(store, only_group(store))
        passes = []
        for night in range(1, nights + 1):
            store_run(store, n=100, labelled_at=START + timedelta(days=7 + night), id_offset=1000 * night,
                      seed=night, base=base, error_slope=0.6 if base < 0.5 else 0.0, estimators=("semantic_entropy",))
            passes.append(recalibrate_store(store, store.read("runs")["run_key"].to_list(), CONFIG, 0.01,
                                            WindowRule()))
        again = recalibrate_store(store, store.read("runs")["run_key"].to_list(), CONFIG, 0.01, WindowRule())
        stored = store.read("gate_monitor").sort("checked_at")
    return [*passes, again, stored]


def test_a_quiet_gate_stays_quiet_and_every_pair_counts_once(tmp_path: Path) -> None:
    *passes, again, stored = nightly(tmp_path / "q.duckdb", nights=4, base=0.02)
    [first], [last] = passes[0].monitors, passes[-1].monitors
    assert not any(p.monitor_alarms for p in passes)
    assert 0 < first.row["n"] < last.row["n"] <= 400 and last.row["nights"] == 4
    assert stored.height == 4 and stored["n"].is_sorted() and not stored["alarmed"].any()
    [unchanged] = again.monitors  # no new pair: nothing counted twice, no new row
    assert unchanged.new_pairs == 0 and unchanged.row["n"] == last.row["n"]


def test_a_gate_whose_answers_go_wrong_alarms_and_says_which_and_since_when(tmp_path: Path) -> None:
    *passes, again, stored = nightly(tmp_path / "w.duckdb", nights=3, base=1.0)  # every new answer wrong
    alarmed = [p for p in passes if p.monitor_alarms]
    assert alarmed, [p.monitors[0].row for p in passes]
    update = alarmed[0].monitor_alarms[0]
    gate_id = update.gate["calibration_id"]
    assert update.row["e_value"] >= update.row["alarm_at"] == 100.0  # one live gate: 1 / level
    assert update.row["rate_lower_bound"] > update.gate["alpha"]
    text = update.alert()
    assert text.startswith(f"anytime-valid monitor of live gate {gate_id[:12]}")
    assert "night(s) since it went live" in text
    assert again.monitor_alarms  # an alarmed gate stays alarmed until it is replaced
    assert stored.filter(calibration_id=gate_id)["alarmed"].to_list()[-1] is True


WAIT = timedelta(days=60)  # every label of these tests arrives within it, whatever the wall clock says


def test_late_labels_reach_the_monitor_exactly_once(tmp_path: Path) -> None:
    """Records seen at T1 but labelled after a pass that already looked past T1 still count, once (their labels
    within the label window: past it, a record still unlabelled is an error, `test_...past_its_window...`)."""
    import polars as pl

    from cic.pipeline.production.ingest import ingest_file
    from cic.pipeline.production.recalibration import labelled_pairs
    from tests.pipeline.test_ingest import T0, write
    from tests.pipeline.test_ingest_history import NOW, _stream

    with Store.open(tmp_path / "late.duckdb") as store:
        ingest_file(store, write(_stream(400, 1, T0 - timedelta(days=20)), tmp_path / "week1.parquet"), now=NOW)
        group = only_group(store, "bot")
        human = group.__class__(**{**group.__dict__, "criterion": "human"})
        gate = make_live(store, human).row(0, named=True)
        traffic = _stream(200, 2, T0 - timedelta(days=2), offset=1000)  # the first 100 wait for their labels
        early = traffic.head(100)
        unlabelled = traffic.with_columns(pl.when(pl.int_range(pl.len()) < 100).then(None)
                                          .otherwise(pl.col("correct")).alias("correct"))
        ingest_file(store, write(unlabelled, tmp_path / "traffic.parquet"), now=NOW)
        runs = store.read("runs")["run_key"].to_list()

        def counts() -> tuple[int, int]:
            pairs = labelled_pairs(store, human)
            answered = pairs.filter((pl.col("at") > gate["window_to"]) & (pl.col("score") <= gate["threshold"]))
            return answered.height, int(answered["error"].sum())

        [first] = recalibrate_store(store, runs, CONFIG, 0.01, WindowRule(), label_window=WAIT).monitors
        assert (first.row["n"], first.row["k"]) == counts() and first.row["n"] > 0
        late = early.select("model", "stream", "question_id", pl.lit(False).alias("correct"))  # every one wrong
        ingest_file(store, write(late, tmp_path / "late-labels.csv"), now=NOW)
        [second] = recalibrate_store(store, runs, CONFIG, 0.01, WindowRule(), label_window=WAIT).monitors
        answered_late = early.filter(pl.col("score:semantic_entropy") <= gate["threshold"]).height
        assert answered_late > 0
        assert second.row["n"] == first.row["n"] + answered_late == counts()[0]
        assert second.row["k"] == first.row["k"] + answered_late == counts()[1]
        assert second.new_pairs == answered_late and second.row["nights"] == 2
        [third] = recalibrate_store(store, runs, CONFIG, 0.01, WindowRule(), label_window=WAIT).monitors  # nothing new
        assert (third.row["n"], third.row["k"]) == (second.row["n"], second.row["k"]) and third.new_pairs == 0
        assert store.read("gate_monitor").height == 2  # no row for a pass that counted nothing


def _updates(counts: list[tuple[int, int]], *, alarmed_before: bool = False) -> list:
    """Monitor updates of len(counts) live gates at alpha 0.1, gate i having counted counts[i] = (n, k)."""
    from cic.pipeline.production.monitoring import update_of

    updates = []
    for i, (n, k) in enumerate(counts):
        gate = {"calibration_id": f"g{i}", "alpha": 0.1}
        previous = {f"g{i}": {"n": 0, "k": 0, "seen_to": START, "nights": 1, "rate_lower_bound": 0.0,
                              "alarmed": alarmed_before}}
        updates.append(update_of(("m", "d", "e", "c"), gate, n, k, START, previous, START))  # type: ignore[arg-type]
    return updates


def _counts_between(low: float, high: float) -> tuple[int, int]:
    """(n, k) whose e-value against rate ≤ 0.1 lies in [low, high)."""
    from cic.stats.monitoring import e_value

    for k in range(0, 200):
        if low <= e_value(400, k, 0.1) < high:
            return 400, k
    raise AssertionError("no count in range")


def test_several_live_gates_alarm_only_past_g_over_level_bonferroni_over_the_family() -> None:
    """With G gates watched at once, each alarms at e ≥ G / level (so P(any false alarm ever) ≤ level): an e-value
    past 1 / level but short of 3 / level alarms a gate watched alone, not one of three."""
    from cic.pipeline.production.monitoring import finish

    level = 0.01
    between = _counts_between(1 / level, 3 / level)
    alone = finish(_updates([between]), level)
    family = finish(_updates([between, (400, 40), (400, 40)]), level)
    assert alone[0].row["alarm_at"] == 1 / level and alone[0].row["alarmed"]
    assert [u.row["alarm_at"] for u in family] == [3 / level] * 3 and not family[0].row["alarmed"]
    from cic.stats.monitoring import lower_bound  # the rate's confidence sequence at the same share of level

    assert family[0].row["rate_lower_bound"] == lower_bound(*between, level / 3) < alone[0].row["rate_lower_bound"]
    assert finish(_updates([_counts_between(3 / level, 1e300), (400, 40), (400, 40)]), level)[0].row["alarmed"]


def test_an_alarm_is_sticky_once_raised_whatever_the_evidence_does_after() -> None:
    from cic.pipeline.production.monitoring import finish

    calm = finish(_updates([(400, 10)], alarmed_before=True), 0.01)[0]
    assert calm.row["e_value"] < 1 and calm.row["alarmed"]  # the evidence fell back; the alarm stays
    assert not finish(_updates([(400, 10)]), 0.01)[0].row["alarmed"]


def test_the_monitor_counts_an_answer_scored_exactly_at_the_threshold() -> None:
    """A threshold accepts every score equal to it: an answer scored exactly at a live gate's threshold was served,
    and the monitor counts it (and its error)."""
    import polars as pl

    from cic.pipeline.production.monitoring import monitor_group
    from cic.pipeline.run.stored_calibration import GroupKey

    key = GroupKey("r", "m", "d", "e", "c")
    gate = {"calibration_id": "g", "threshold": 0.4, "alpha": 0.1, "window_to": datetime(2026, 1, 1, tzinfo=UTC),
            "created_at": datetime(2026, 1, 1, tzinfo=UTC)}
    after = datetime(2026, 1, 2, tzinfo=UTC)
    pairs = pl.DataFrame({"question_id": ["a", "b", "c"], "score": [0.1, 0.4, 0.7], "error": [0, 1, 1],
                          "at": [after, after, after]})
    (update,) = monitor_group(key, pairs, [gate], {}, after)  # type: ignore[list-item]
    assert (update.row["n"], update.row["k"]) == (2, 1)
