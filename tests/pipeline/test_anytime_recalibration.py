"""`recalibration.rule: anytime` against a real store: each pass counts, once and in record order, every labelled
answer whose label window has closed (a label arriving after that is reported, never counted), the widest
certified threshold goes live and serves after a replay of its state,
a changed label stops it, an alarm withdraws it and restarts the key, and datasets certified together split delta."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.gates.serving import served_entries
from cic.pipeline.production.recalibration import WindowRule, recalibrate_store
from cic.stats.anytime import AnytimeState
from cic.store import Store
from cic.store.queries import anytime_counted_order, newest_anytime_state
from tests.support.database import raw_sql
from tests.support.pipeline_data import store_run

pytestmark = pytest.mark.slow  # nights of recalibration on a store: the slow tier

CONFIG = CalibrationConfig(alphas=(0.2,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4)
DAY = datetime(2026, 1, 1, tzinfo=UTC)
GRID = 20


def one_pass(db: Path, config: CalibrationConfig = CONFIG, night: float = 0.5, **options: object):
    """A pass on the evening of day `night` (days after DAY)."""
    with Store.open(db) as store:
        keys = store.read("runs").get_column("run_key").to_list()
        return recalibrate_store(store, keys, config, 0.05, WindowRule(), anytime_grid=GRID,
                                 now=DAY + timedelta(days=night), **options)


def anytime_gates(db: Path) -> pl.DataFrame:
    with Store.open(db, read_only=True) as store:
        return gates(store, search="anytime", estimator="predictive_entropy").sort("created_at")


def test_every_answer_counts_once_in_record_order_and_the_widened_threshold_serves(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        store_run(store, n=1000, seed=1, base=0.02, error_slope=0.3, labelled_at=DAY)
    first = one_pass(db)
    (update,) = [u for u in first.anytime if u.key.estimator == "predictive_entropy"]
    assert update.counted_now == update.counted == 1000 and update.threshold is not None and update.gate_id
    (live,) = anytime_gates(db).filter(state="live").iter_rows(named=True)
    assert live["kind"] == "anytime" and live["bound"] == "e-process" and live["threshold"] == update.threshold
    again = one_pass(db, night=0.6)  # nothing new: nothing counted twice, no new gate
    assert [u.counted_now for u in again.anytime] == [0, 0] and all(u.gate_id is None for u in again.anytime)
    with Store.open(db) as store:  # more traffic, and labels of questions seen before the last pass: too late
        store_run(store, n=300, seed=2, base=0.02, error_slope=0.3, id_offset=1000, labelled_at=DAY + timedelta(1))
        store_run(store, n=50, seed=3, base=0.02, error_slope=0.3, id_offset=1300, labelled_at=DAY - timedelta(3))
    later = one_pass(db, night=1.5)
    (update,) = [u for u in later.anytime if u.key.estimator == "predictive_entropy"]
    assert update.counted_now == 300 and update.counted == 1300 and update.threshold >= live["threshold"]
    assert update.late == 50 and update.waiting == 0  # reported, never counted (they would bias the order)
    with Store.open(db, read_only=True) as store:  # the stored state is the e-processes over the counted order
        state = newest_anytime_state(store, live["run_key"], "predictive_entropy", live["criterion"], 0.2, 0.05)
        order = anytime_counted_order(store, state["state_id"])
        pairs = store.calibration_frame("m", "d", "predictive_entropy", live["criterion"])
        served = {e["gate_id"] for e in served_entries(store) if e["serve"] == "gate"}
    assert order.get_column("position").to_list() == list(range(1300))
    stored = AnytimeState.from_json(state["state_json"])
    direct = AnytimeState.start(stored.grid, alpha=0.2, delta=0.05)
    ordered = order.join(pairs, on="question_id").sort("position")
    direct.update(ordered.get_column("score").to_numpy(), ordered.get_column("error").to_numpy())
    assert direct.threshold == stored.threshold and (direct.log_wealth == stored.log_wealth).all()
    newest = anytime_gates(db).filter(state="live").row(0, named=True)
    assert newest["calibration_id"] in served and newest["n_cal"] in (1000, 1300)


def test_a_changed_label_under_the_live_anytime_gate_stops_it_serving(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=1000, seed=1, base=0.02, error_slope=0.3, labelled_at=DAY)
    one_pass(db)
    with Store.open(db) as store:
        label = store.read("labels", run_key=key).row(0, named=True)
        store.upsert("labels", pl.DataFrame([{**label, "aligned": not label["aligned"]}],
                                            schema=store.read("labels").schema))
        refused = [e for e in served_entries(store) if e.get("flagged_gate_id")]  # its keys alone serve nothing
        assert refused and all(e["serve"] == "nothing" and "replaying its counted answers" in e["reason"]
                               for e in refused)


def test_an_alarm_withdraws_the_anytime_gate_and_restarts_its_key_from_then_on(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        store_run(store, n=1000, seed=1, base=0.02, error_slope=0.3, labelled_at=DAY)
    one_pass(db)
    (live,) = anytime_gates(db).filter(state="live").iter_rows(named=True)
    with Store.open(db) as store:  # the rate rises: every answer wrong
        store_run(store, n=400, seed=4, base=1.0, id_offset=1000, labelled_at=DAY + timedelta(2))
    drifted = one_pass(db, night=2.5)
    assert live["calibration_id"] in drifted.withdrawn
    with Store.open(db, read_only=True) as store:
        state = newest_anytime_state(store, live["run_key"], "predictive_entropy", live["criterion"], 0.2, 0.05)
        (entry,) = [e for e in served_entries(store, estimator="predictive_entropy") if e["search"] == "anytime"]
    assert state["epoch"] == 1 and state["counted"] == 0 and state["threshold"] is None
    assert entry["serve"] == "nothing" and entry["flagged_gate_id"] == live["calibration_id"]
    with Store.open(db) as store:
        store_run(store, n=100, seed=5, base=0.02, error_slope=0.3, id_offset=1400, labelled_at=DAY + timedelta(3))
    after = one_pass(db, night=3.5)
    (update,) = [u for u in after.anytime if u.key.estimator == "predictive_entropy"]
    assert update.counted == 100  # only what was seen after the alarm


def _two_keys_live(db: Path) -> dict[str, str]:
    """A store whose two estimators each have a live anytime gate; estimator -> its gate id."""
    with Store.open(db) as store:
        store_run(store, n=1000, seed=1, base=0.02, error_slope=0.3, labelled_at=DAY)
    one_pass(db)
    with Store.open(db, read_only=True) as store:
        live = gates(store, search="anytime").filter(state="live")
    assert live.height == 2
    return dict(live.select("estimator", "calibration_id").iter_rows())


@pytest.mark.faults
@pytest.mark.parametrize("damage", ["state does not parse", "counted list edited", "counted label relabelled"])
def test_a_key_whose_state_cannot_be_carried_on_pages_and_restarts_while_the_others_run(tmp_path: Path,
                                                                                        damage: str) -> None:
    """One key's state made unusable (a corrupt row, its counted list cut): the pass does not stop — that key pages
    with why, its live gate is withdrawn, its state restarts and certifies again from later answers; the other key
    is counted as usual and keeps serving. Labels it counted relabelled: both keys counted them (one run, one
    criterion), so both restart."""
    from cic.pipeline.alerts import STATE_BROKEN

    db = tmp_path / "t.duckdb"
    live = _two_keys_live(db)
    broken, other = "predictive_entropy", next(e for e in live if e != "predictive_entropy")
    with Store.open(db) as store:
        state = newest_anytime_state(store, store.read("runs")["run_key"][0], broken,
                                     gates(store).row(0, named=True)["criterion"], 0.2, 0.05)
    if damage == "state does not parse":
        raw_sql(db, f"UPDATE anytime_states SET state_json = '{{\"grid\": [' WHERE state_id = '{state['state_id']}'")
    elif damage == "counted list edited":
        raw_sql(db, f"DELETE FROM anytime_counted WHERE state_id = '{state['state_id']}' AND position >= 990")
    else:  # relabelled with its event, as `cic ingest --relabel` records it
        with Store.open(db) as store:
            order = anytime_counted_order(store, state["state_id"]).head(40)
            labels = store.read("labels").filter(pl.col("question_id").is_in(order["question_id"].to_list()))
            store.upsert("labels", labels.with_columns(~pl.col("aligned")))
            store.upsert("label_events", labels.select(
                pl.concat_str(pl.lit("e"), "question_id").alias("event_id"), "run_key", "question_id", "criterion",
                pl.col("aligned").alias("old_aligned"), (~pl.col("aligned")).alias("new_aligned"),
                pl.lit("fix.csv").alias("source"), pl.lit(DAY + timedelta(days=1)).alias("created_at")))
    with Store.open(db) as store:
        store_run(store, n=200, seed=6, base=0.02, error_slope=0.3, id_offset=1000, labelled_at=DAY + timedelta(1))
    night = one_pass(db, night=1.5)  # no exception: the pass runs through
    by_estimator = {u.key.estimator: u for u in night.anytime}
    hit = {broken, other} if damage == "counted label relabelled" else {broken}
    assert {e for e, u in by_estimator.items() if u.broken is not None} == hit
    if other not in hit:
        assert by_estimator[other].counted_now == 200 and by_estimator[other].counted == 1200
    pages = [a for u, a in night.notes if a.kind == STATE_BROKEN]
    assert len(pages) == len(hit) and pages[0].kind.severity == "page" and "restarted" in pages[0]
    assert {e for e in live if live[e] in night.withdrawn} == hit
    with Store.open(db, read_only=True) as store:
        served = {e["estimator"]: e for e in served_entries(store) if e["search"] == "anytime"}
        restarted = newest_anytime_state(store, state["run_key"], broken, state["criterion"], 0.2, 0.05)
    assert {e for e, entry in served.items() if entry["serve"] == "nothing"} == hit
    assert restarted["epoch"] == state["epoch"] + 1 and restarted["counted"] == 0
    with Store.open(db) as store:
        store_run(store, n=1500, seed=7, base=0.02, error_slope=0.3, id_offset=2000, labelled_at=DAY + timedelta(3))
    later = one_pass(db, night=3.5)  # what the page promised: the key certifies again from later answers
    again = {u.key.estimator: u for u in later.anytime}[broken]
    assert again.broken is None and again.counted == 1500 and again.gate_id is not None


def test_datasets_certified_together_split_delta_between_their_states(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with Store.open(db) as store:
        for i, name in enumerate(("d", "e")):
            store_run(store, dataset=name, n=1000, seed=i, base=0.02, error_slope=0.3, labelled_at=DAY)
    one_pass(db, CalibrationConfig(alphas=(0.2,), group_by="dataset"))
    with Store.open(db, read_only=True) as store:
        states = store.read("anytime_states")
    assert set(states.get_column("groups")) == {2}
    assert {AnytimeState.from_json(s).delta for s in states.get_column("state_json")} == {0.025}


def _traffic_with_late_wrong_labels(store: Store, *, n: int = 1200, delay: timedelta = timedelta(days=3)) -> str:
    """`n` records seen over day 0 (observations), each right answer labelled as it is seen and each wrong one
    `delay` later (complaints): the informative delay of production labels."""
    from tests.support.pipeline_data import simulated_pairs

    pairs = simulated_pairs(n=n, seed=7, base=0.05, error_slope=0.4)
    key = store.register_run("m", "d", "validation", "p1", {"seed": 0})
    seen = [DAY + timedelta(seconds=60 * i) for i in range(n)]
    labelled = [s + (delay if wrong else timedelta(0)) for s, wrong in zip(seen, pairs["error"], strict=True)]
    ids = pairs["question_id"]
    with store.transaction():
        store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": ids, "estimator": "predictive_entropy",
                                             "value": pairs["score"]}))
        store.upsert("labels", pl.DataFrame({"run_key": key, "question_id": ids, "criterion": "human",
                                             "aligned": ~pairs["error"], "value": 1.0 - pairs["error"].cast(float),
                                             "created_at": labelled},
                                            schema_overrides={"created_at": pl.Datetime("us", "UTC")}))
        store.upsert("observations", pl.DataFrame({
            "run_key": key, "question_id": ids, "observed_at": seen, "source": "traffic.csv",
            "created_at": seen, "ingest": None}, schema=store.read("observations").schema))
    return key


def test_labels_that_arrive_late_when_wrong_are_counted_only_once_their_window_closes(tmp_path: Path) -> None:
    """Wrong answers' labels arrive three days late. Without a label window and leaving unlabelled records out
    (`missing_labels: at_random`) the first night counts only the right answers it has labels for (a biased sample:
    no error at all) and those records are never counted again; counting them as errors (the default) counts every
    record, the unlabelled ones as the errors they are; with a four-day window nothing is counted until every label
    can have arrived, then all of them, in record order."""
    for window, night, expect in ((timedelta(0), 1.0, "biased"), (timedelta(0), 1.0, "imputed"),
                                  (timedelta(days=4), 1.0, "waiting"), (timedelta(days=4), 5.0, "complete")):
        db = tmp_path / f"{window.days}-{night}-{expect}.duckdb"
        with Store.open(db) as store:
            key = _traffic_with_late_wrong_labels(store)
            truth = 1 - store.read("labels", run_key=key).get_column("aligned").mean()
            wrong = int(round(truth * 1200))
        # the store as a pass that night finds it: only the labels stored by then
        raw_sql(db, "DELETE FROM labels WHERE created_at > ?", params=[DAY + timedelta(days=night)])
        policy = CalibrationConfig(**{**CONFIG.model_dump(), "missing_labels": "at_random"}) \
            if expect == "biased" else CONFIG
        (update,) = one_pass(db, policy, night=night, label_window=window).anytime
        with Store.open(db, read_only=True) as store:
            order = anytime_counted_order(store, update.state_id)
            frame = store.calibration_frame("m", "d", "predictive_entropy", "human", allow_partial=True)
            counted = order.join(frame, on="question_id").sort("position")
        if expect == "biased":
            assert update.unlabelled == wrong > 100 and update.counted == 1200 - wrong
            assert counted.get_column("error").sum() == 0  # what the old rule fed its e-processes first
        elif expect == "imputed":  # every record counted; the unlabelled ones, all wrong, as errors
            assert update.unlabelled == wrong > 100 and update.counted == 1200
            assert counted.height == 1200 - wrong  # the others are counted without a label: as errors
        elif expect == "waiting":
            assert update.counted == 0 and update.unlabelled == 0 and update.waiting == 1200  # labelled or not
        else:
            assert update.counted == 1200 and update.unlabelled == 0 and update.late == 0
            assert abs(counted.get_column("error").mean() - truth) < 1e-12  # every record, right or wrong
            assert counted.get_column("question_id").to_list() == sorted(counted.get_column("question_id"))
