"""Judge-plus-people gates in the pipeline: `calibration.judged` certifies a judge's labels corrected by people's on
a random subset (`cic.calibrate_judged`) in the calibrate stage and in recalibration, under criterion
`judge+people`; a re-check rebuilds both kinds of label; limits, error tests and monitors read the people."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError

import cic
from cic.errors import UserError
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.gates.certificates import recertify_all, unattainable_limits
from cic.pipeline.gates.gate_rows import gate_rows
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.production.recalibration import WindowRule, labelled_pairs, recalibrate_store
from cic.pipeline.run.stored_calibration import groups_of_run, truth_of
from cic.stats.limits import window_limits
from cic.store import Store

START = datetime(2026, 1, 1, tzinfo=UTC)
JUDGED = {"judge": "judge", "people": "human"}


def judged_config(**change: object) -> CalibrationConfig:
    """Two bounds, a search that runs on judge-plus-people tests and one that needs a grid, judge+human configured
    (built anew: a copy would keep the original's resolved searches)."""
    return CalibrationConfig(**{"alphas": (0.2,), "bounds": ("cp", "hoeffding"),
                                "searches": ("fixed_sequence", "bonferroni"), "n_splits": 3, "judged": [JUDGED],
                                **change})


CONFIG = judged_config()


def store_judged(store: Store, *, n: int = 2000, seed: int = 0, at: datetime = START, offset: int = 0,
                 run_key: str | None = None) -> tuple[str, pl.DataFrame]:
    """A run whose judge labelled every question (98% agreeing with the truth) and people every fourth at random;
    returns its key and (question_id, score, judge, human, at) as stored."""
    rng = np.random.default_rng(seed)
    key = run_key or store.register_run("m", "d", "validation", "p1", {"seed": 0})
    ids = [f"q{i + offset:05d}" for i in range(n)]
    score = rng.random(n)
    wrong = rng.random(n) < 0.3 * score
    judge = np.where(rng.random(n) < 0.98, wrong, ~wrong)
    asked = rng.random(n) < 0.25
    when = [at + timedelta(microseconds=i) for i in range(n)]
    labels = pl.concat([
        pl.DataFrame({"run_key": key, "question_id": ids, "criterion": "judge", "aligned": ~judge,
                      "value": 1.0 - judge, "created_at": when}),
        pl.DataFrame({"run_key": key, "question_id": ids, "criterion": "human", "aligned": ~wrong,
                      "value": 1.0 - wrong, "created_at": when}).filter(pl.Series(asked))])
    with store.transaction():
        store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": ids, "estimator": "semantic_entropy",
                                             "value": score}))
        store.upsert("labels", labels)
    truth = pl.DataFrame({"question_id": ids, "score": score, "judge": judge.astype(float),
                          "human": np.where(asked, wrong, np.nan), "at": when})
    return key, truth


def expected(truth: pl.DataFrame, alpha: float = 0.2) -> cic.CalibrationResult:
    return cic.calibrate_judged(truth["score"].to_numpy(), truth["judge"].to_numpy(), truth["human"].to_numpy(),
                                alpha=alpha, delta=0.05, search="fixed_sequence", ids=truth["question_id"].to_list())


def judged_gates(store: Store) -> pl.DataFrame:
    return gates(store).filter(pl.col("criterion") == "judge+human")


def test_the_calibrate_stage_certifies_judge_plus_people_as_calibrate_judged_does(tmp_path: Path) -> None:
    """Beside each labeller's own gates, one judge+human gate per (alpha, search that runs on its tests): the
    threshold `cic.calibrate_judged` certifies on the same pairs, labelled "judge+people", with no split protocol."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        key, truth = store_judged(store)
    stats = calibrate_store(str(db), [key], CONFIG)
    with Store.open(db) as store:
        made = judged_gates(store)
        criteria = set(store.read("calibrations").get_column("criterion").to_list())
        evaluated = set(store.read("evaluations").get_column("criterion").to_list())
    want = expected(truth)
    assert criteria == {"judge", "human", "judge+human"} and evaluated == {"judge", "human"}
    assert made.height == 1 and stats.groups == 3  # bonferroni needs a grid: no judged gate of it
    row = made.row(0, named=True)
    assert (row["search"], row["bound"], row["state"]) == ("fixed_sequence", "cp", "live")
    assert want.feasible and row["threshold"] == want.threshold and row["n_accepted"] == want.n_accepted
    assert cic.CalibrationResult.from_json(row["result_json"]).gate().metadata["labels"] == "judge+people"
    # without the config's judged entry, no such group
    with Store.open(db, read_only=True) as store:
        run = store.read("runs").row(0, named=True)
        assert [g.criterion for g in groups_of_run(store, run)] == ["human", "judge"]
        assert [g.criterion for g in groups_of_run(store, run, judged=CONFIG.judged)][-1] == "judge+human"
        assert [g.criterion for g in groups_of_run(store, run, criteria=["judge", "human"], judged=CONFIG.judged)] \
            == ["human", "judge", "judge+human"]


def test_a_judged_gate_is_recertified_from_both_labellers_and_refused_when_a_persons_label_changes(
        tmp_path: Path) -> None:
    """The re-check rebuilds the judge's pairs and the people's verdicts as of the gate's creation: a person
    labelling one more question later changes nothing; a person's stored verdict flipped makes it refuse."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        key, truth = store_judged(store)
    calibrate_store(str(db), [key], CONFIG)
    with Store.open(db) as store:
        row = gate_rows(judged_gates(store))
        recertify_all(store, row)
        unasked = truth.filter(pl.col("human").is_nan()).row(0, named=True)["question_id"]
        store.upsert("labels", pl.DataFrame({"run_key": key, "question_id": unasked, "criterion": "human",
                                             "aligned": False, "value": 0.0, "created_at": datetime.now(UTC)}))
        recertify_all(store, row)  # a later verdict was not among the gate's labels
        asked = truth.filter(pl.col("human").is_not_nan()).row(0, named=True)
        flipped = store.read("labels", criterion="human", question_id=asked["question_id"]) \
            .with_columns(aligned=~pl.col("aligned"))
        store.upsert("labels", flipped)
        with pytest.raises(UserError, match="fingerprint differs"):
            recertify_all(store, row)


def test_recalibration_certifies_the_new_window_with_judge_and_people(tmp_path: Path) -> None:
    """A week later, the pass's judge+human candidate is `cic.calibrate_judged` on the new window alone; the error
    test at the live threshold and the live gate's monitor count only answers people labelled; an alpha out of
    reach is explained on the people's verdicts."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        key, _ = store_judged(store)
    config = judged_config(alphas=(0.2, 0.01), searches=("fixed_sequence",))
    calibrate_store(str(db), [key], config)
    with Store.open(db) as store:
        _, week = store_judged(store, seed=1, at=START + timedelta(days=7), offset=5000, run_key=key)
        done = recalibrate_store(store, [key], config, 0.05, WindowRule(), now=START + timedelta(days=8))
        live = gate_rows(judged_gates(store).filter(pl.col("state") == "live"))
        monitored = store.read("gate_monitor").filter(pl.col("calibration_id") == live[0].calibration_id)
    mine = [c for c in done.candidates if c.key.criterion == "judge+human"]
    assert sorted(c.row["alpha"] for c in mine) == [0.01, 0.2]
    reached = next(c for c in mine if c.row["alpha"] == 0.2)
    want = expected(week)
    assert reached.row["threshold"] == want.threshold and reached.row["n_cal"] == week.height
    assert reached.live is not None and reached.live.calibration_id == live[0].calibration_id
    people = week.filter(pl.col("human").is_not_nan())
    tests = [c for k, c in done.checks if k.criterion == "judge+human" and c.test.name == "error_rate"]
    assert tests and all(c.test.n == int((people["score"] <= reached.live["threshold"]).sum()) for c in tests)
    answered = people.filter(pl.col("score") <= live[0]["threshold"])
    assert monitored.row(0, named=True)["n"] == answered.height
    assert monitored.row(0, named=True)["k"] == int(answered["human"].sum())
    # the people's own group: their unlabelled records are not missing labels (a sample by design), left out
    (people_only,) = [c for c in done.candidates if c.key.criterion == "human" and c.row["alpha"] == 0.2
                      and c.row["bound"] == "cp"]
    assert people_only.row["n_cal"] == people.height
    assert not [a for c in done.candidates for a in c.alerts if "have no label" in a]
    assert json.loads(people_only.row["plan_json"])["missing_labels"] == "at_random"
    out_of_reach = next(c for c in mine if c.row["alpha"] == 0.01)
    why = window_limits(people["score"].to_numpy(), people["human"].to_numpy().astype(int), 0.01)
    assert out_of_reach.row["threshold"] is None and any(why in a for a in out_of_reach.alerts)


def test_truth_of_reads_the_people_and_leaves_one_labellers_pairs_alone(tmp_path: Path) -> None:
    """The stored pairs of a judge+human group carry the people's verdicts, null where none labelled."""
    with Store.open(tmp_path / "s.duckdb") as store:
        key, truth = store_judged(store, n=40)
        run = store.read("runs").row(0, named=True)
        group = groups_of_run(store, run, judged=CONFIG.judged)[-1]
        pairs = labelled_pairs(store, group)
        plain = labelled_pairs(store, groups_of_run(store, run)[0])
    assert pairs.height == 40 and pairs["human"].null_count() == int(truth["human"].is_nan().sum())
    people = truth_of(pairs)
    assert people.height == 40 - pairs["human"].null_count()
    assert people["error"].to_list() == pairs.drop_nulls("human")["human"].cast(pl.Int8).to_list()
    assert truth_of(plain).equals(plain)


def test_unattainable_limits_of_a_judged_gate_read_the_people(tmp_path: Path) -> None:
    """`cic gate export`'s limits of a judged gate that certifies nothing come from the people's verdicts."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        key, truth = store_judged(store)
    calibrate_store(str(db), [key], judged_config(alphas=(0.01,)))
    with Store.open(db) as store:
        row = gate_rows(judged_gates(store))[0]
        limits = unattainable_limits(store, row)
    people = truth.filter(pl.col("human").is_not_nan())
    assert limits["why"] == window_limits(people["score"].to_numpy(), people["human"].to_numpy().astype(int), 0.01)


@pytest.mark.parametrize("entry, says", [
    ({"judge": "judge", "people": "judge"}, "both 'judge'"),
    ({"judge": "judge+x", "people": "human"}, "judge"),
    ({"judge": "judge", "people": "human", "judge_share": 1.0}, "judge_share"),
    ([JUDGED, {**JUDGED, "judge_share": 0.3}], "'judge\\+human' is listed twice"),
])
def test_a_judged_entry_that_cannot_certify_is_refused(entry: dict[str, object] | list[dict[str, object]],
                                                      says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        CalibrationConfig(judged=entry if isinstance(entry, list) else [entry])
