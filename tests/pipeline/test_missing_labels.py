"""Labels that never come, through the product's own nightly pass on a real store: a record whose label window closed
without a label counts as an error wherever a threshold accepts it (`missing_labels: worst_case`, the default), so
labels that go missing by score, by correctness or both never certify a threshold whose true error rate exceeds
alpha; `at_random` leaves them out and says so on every surface; too many missing pages and withdraws; a record
ingested without its label gets a 14-day window by default; a gate re-certifies with the labels it counted."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import polars as pl
import pytest

from cic.pipeline.alerts import MISSING_LABELS, kind_of
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.gate_rows import gate_rows
from cic.pipeline.gates.lifecycle import gates
from cic.pipeline.gates.serving import served_entries
from cic.pipeline.production.ingest import ingest_file
from cic.pipeline.production.recalibration import WindowRule, effective_label_window, recalibrate_store
from cic.pipeline.run.missing_labels import (
    ASSUMPTIONS,
    AT_RANDOM,
    DEFAULT_LABEL_WINDOW,
    EARLIER,
    WORST_CASE,
    assumption,
    counted,
    missing_share,
    observable,
    policy_of,
)
from cic.store import Store
from tests.support.database import raw_sql

ALPHA = 0.1
DAY = datetime(2026, 3, 1, tzinfo=UTC)
WINDOW = timedelta(days=4)
ROOT = Path(__file__).resolve().parents[2]


def config(policy: str = WORST_CASE) -> CalibrationConfig:
    return CalibrationConfig(alphas=(ALPHA,), bounds=("cp",), searches=("fixed_sequence",), n_splits=4,
                             missing_labels=policy)


def night_records(night: int, n: int = 300, seed: int = 0) -> pl.DataFrame:
    """One night's traffic: scores U(0, 1), wrong with probability 4·alpha·U, so a threshold t has true error rate
    R(t) = 2·alpha·t among what it accepts (valid exactly for t <= 0.5)."""
    rng = np.random.default_rng([seed, night])
    score = rng.random(n)
    return pl.DataFrame({
        "model": "qwen", "stream": "bot", "question_id": [f"s{seed}n{night}-{i}" for i in range(n)], "question": "?",
        "answer": "a", "timestamp": [DAY + timedelta(days=night, minutes=i) for i in range(n)],
        "score:semantic_entropy": score, "correct": rng.random(n) >= 4 * ALPHA * score})


def true_rate(threshold: float | None) -> float:
    return 0.0 if threshold is None else 2 * ALPHA * min(threshold, 1.0)


def ingest_days(store: Store, tmp: Path, nights: int, delay: Any, *, today: int, since: int = 0,
                seed: int = 0) -> None:
    """Days `since` … `today` of a stream of `nights` nights: each night's records ingested that evening without
    labels, each label ingested the evening it arrives (`delay(score, correct)`: days after its record; None:
    never)."""
    for day in range(since, today + 1):
        if day < nights:
            path = tmp / f"records-{seed}-{day}.parquet"
            night_records(day, seed=seed).with_columns(pl.lit(None, dtype=pl.Boolean).alias("correct")) \
                .write_parquet(path)
            ingest_file(store, path, now=DAY + timedelta(days=day, hours=23))
        arriving = []
        for night in range(min(nights, day + 1)):
            frame = night_records(night, seed=seed)
            days = [delay(s, c) for s, c in zip(frame["score:semantic_entropy"], frame["correct"], strict=True)]
            arriving.append(frame.filter(pl.Series([d is not None and night + d == day for d in days])))
        labels = pl.concat(arriving).select("model", "stream", "question_id", "correct")
        if labels.height:
            path = tmp / f"labels-{seed}-{day}.csv"
            labels.write_csv(path)
            ingest_file(store, path, now=DAY + timedelta(days=day, hours=23, minutes=30))


def by_score(score: float, correct: bool) -> int | None:
    """The review queue the issue describes: labels of uncertain answers (score > 0.3) arrive 10 days late."""
    return 10 if score > 0.3 else 1


def review_queue(score: float, correct: bool) -> int | None:
    """Labels of answers above 0.3 never come, but for one in ten of them (picked by the score's digits)."""
    return 1 if score <= 0.3 or int(score * 1e6) % 10 == 0 else None


def in_time(score: float, correct: bool) -> int:
    return 1


def nightly(db: Path, night: int, policy: str, **options: Any) -> Any:
    with Store.open(db) as store:
        keys = store.read("runs").get_column("run_key").to_list()
        return recalibrate_store(store, keys, config(policy), 0.01, WindowRule(), label_window=WINDOW,
                                 now=DAY + timedelta(days=night, hours=23, minutes=45), **options)


def certified(db: Path) -> list[dict[str, Any]]:
    with Store.open(db, read_only=True) as store:
        return [r for r in gates(store).iter_rows(named=True) if r["threshold"] is not None]


PASS_NIGHTS = (1, 4, 6, 9, 11)  # before any window closed, as the first close, and on until the late labels come


@pytest.mark.slow  # twelve nights of ingest, five recalibration passes, three ways
@pytest.mark.parametrize("rule", ["window", "anytime"])
def test_labels_missing_by_score_never_certify_an_invalid_threshold_night_after_night(tmp_path: Path,
                                                                                      rule: str) -> None:
    """Labels of records with score > 0.3 arrive 10 days late, the label window is 4 days: every night the
    certificate counts those records as errors, so no night certifies (or serves) a threshold above 0.5; the same
    stream with every label in time does certify; leaving the unlabelled records out (`at_random`) certifies the
    answer-everything gate the issue saw served."""
    grid = {"anytime_grid": 20} if rule == "anytime" else {}
    outcomes: dict[tuple[str, str], list[float]] = {}
    for name, delay, policy in (("by score", by_score, WORST_CASE), ("in time", in_time, WORST_CASE),
                                ("by score", by_score, AT_RANDOM)):
        db = tmp_path / f"{rule}-{name}-{policy}.duckdb"
        thresholds = []
        since = 0
        for night in PASS_NIGHTS:  # every day ingested; the pass runs on some nights (each one is seconds)
            with Store.open(db) as store:
                ingest_days(store, tmp_path, 12, delay, since=since, today=night)
            since = night + 1
            result = nightly(db, night, policy, auto_promote=True, **grid)
            with Store.open(db, read_only=True) as store:
                served = [e for e in served_entries(store) if e["serve"] == "gate"]
            thresholds += [r["threshold"] for r in certified(db)] + [e["threshold"] for e in served]
            assert result is not None
        outcomes[(name, policy)] = thresholds
    assert outcomes[("by score", WORST_CASE)], "the worst case still certifies something below 0.5"
    assert max(true_rate(t) for t in outcomes[("by score", WORST_CASE)]) <= ALPHA
    assert max(outcomes[("in time", WORST_CASE)]) > 0.2  # the control certifies a useful threshold
    assert max(true_rate(t) for t in outcomes[("by score", AT_RANDOM)]) > ALPHA  # the failure the default guards


def test_a_first_gate_counts_labels_missing_past_the_window_as_errors_and_the_export_says_which_assumption(
        tmp_path: Path) -> None:
    """One pass after the window closed on labels that came for confident answers and for one in ten of the others
    (`review_queue`): the worst case certifies at most 0.5 (true rate <= alpha); at_random certifies past it — and
    the export and the serving-now line state the assumption each rests on."""
    out = {}
    for policy in (WORST_CASE, AT_RANDOM):
        db = tmp_path / f"{policy}.duckdb"
        with Store.open(db) as store:
            ingest_days(store, tmp_path, 3, review_queue, today=20)
        result = nightly(db, 20, policy, auto_promote=True)
        with Store.open(db, read_only=True) as store:
            (entry,) = [e for e in served_entries(store) if e.get("threshold") is not None or e["serve"] == "gate"]
        out[policy] = (entry, result)
    worst, _ = out[WORST_CASE]
    random, result = out[AT_RANDOM]
    assert true_rate(worst["threshold"]) <= ALPHA and worst["labels"] == ASSUMPTIONS[WORST_CASE]
    assert true_rate(random["threshold"]) > ALPHA
    assert random["labels"] == "assumes labels go missing independently of score and correctness"
    (line,) = [r.line() for r in result.serving if r.serves]
    assert line.endswith("; assumes labels go missing independently of score and correctness")


def test_the_default_label_window_is_14_days_where_records_came_without_their_label(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        with_labels = night_records(0)
        path = tmp_path / "with.parquet"
        with_labels.write_parquet(path)
        ingest_file(store, path, now=DAY + timedelta(hours=23))
        keys = store.read("runs").get_column("run_key").to_list()
        assert effective_label_window(store, keys, None) == timedelta(0)
        assert effective_label_window(store, keys, timedelta(days=2)) == timedelta(days=2)
        ingest_days(store, tmp_path, 1, in_time, seed=5, today=0)  # records first, their labels not yet
        keys = store.read("runs").get_column("run_key").to_list()
        assert effective_label_window(store, keys, None) == DEFAULT_LABEL_WINDOW == timedelta(days=14)


def test_labels_missing_above_the_limit_page_and_withdraw_the_live_gate(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        ingest_days(store, tmp_path, 2, in_time, today=5)
    first = nightly(db, 5, WORST_CASE, auto_promote=True)
    assert first.promoted and not first.withdrawn
    with Store.open(db) as store:  # a week of traffic whose labels stop coming
        ingest_days(store, tmp_path, 9, lambda s, c: None, since=6, today=20, seed=1)
    later = nightly(db, 20, WORST_CASE, missing_limit=0.2)
    assert set(later.withdrawn) == set(first.promoted)
    assert {kind_of(a) for a in later.withdrawn.values()} == {MISSING_LABELS}
    assert "have no label after their label window closed (limit 20%)" in next(iter(later.withdrawn.values()))
    with Store.open(db, read_only=True) as store:
        assert [e["serve"] for e in served_entries(store)] == ["nothing"]
    quiet = tmp_path / "quiet.duckdb"  # the same with a limit above the share: no such page (the monitor, counting
    # the unlabelled records as errors, may still alarm: that is the worst case failing closed)
    with Store.open(quiet) as store:
        ingest_days(store, tmp_path, 2, in_time, today=5)
    nightly(quiet, 5, WORST_CASE, auto_promote=True)
    with Store.open(quiet) as store:
        ingest_days(store, tmp_path, 9, lambda s, c: None, since=6, today=20, seed=1)
    calm = nightly(quiet, 20, WORST_CASE, missing_limit=1.0)
    assert MISSING_LABELS not in {kind_of(a) for a in calm.withdrawn.values()}
    assert MISSING_LABELS not in {kind_of(a) for _, a in calm.alerts}


def test_a_gate_counted_with_missing_labels_recertifies_after_they_arrive_and_an_edited_policy_is_refused(
        tmp_path: Path) -> None:
    """A label that arrives after the gate counted its record as an error does not change the gate's certificate
    (the record is rebuilt as the error it was counted as); flipping the stored policy to at_random changes the
    pairs the gate rests on and is refused."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        ingest_days(store, tmp_path, 3, lambda s, c: 1 if s <= 0.5 else 30, today=10)
    nightly(db, 10, WORST_CASE, auto_promote=True)
    with Store.open(db, read_only=True) as store:
        (before,) = [e for e in served_entries(store) if e["serve"] == "gate"]
    with Store.open(db) as store:  # the late labels come
        ingest_days(store, tmp_path, 3, lambda s, c: 1 if s <= 0.5 else 30, since=11, today=40)
    with Store.open(db, read_only=True) as store:
        (after,) = [e for e in served_entries(store) if e["serve"] == "gate"]
        (row,) = gate_rows(gates(store).filter(calibration_id=before["gate_id"]))
    assert after["gate_id"] == before["gate_id"] and after["threshold"] == before["threshold"]
    assert policy_of(row.plan_json) == WORST_CASE
    raw_sql(db, "UPDATE calibrations SET plan_json = replace(plan_json, 'worst_case', 'at_random') "
                "WHERE calibration_id = ?", params=[before["gate_id"]])
    with Store.open(db, read_only=True) as store:
        (refused,) = [e for e in served_entries(store) if e.get("flagged_gate_id") == before["gate_id"]]
    assert refused["serve"] == "nothing" and "fingerprint differs" in refused["reason"]


def test_the_cut_keeps_unlabelled_records_as_errors_only_under_the_worst_case() -> None:
    pairs = pl.DataFrame({"question_id": ["a", "b", "c", "d"], "score": [0.1, 0.2, 0.3, 0.4],
                          "error": [0, 1, 1, 1], "at": [1, 2, 3, 9], "labelled": [True, True, False, False]})
    assert counted(pairs, None, WORST_CASE)["question_id"].to_list() == ["a", "b", "c", "d"]
    assert counted(pairs, 5, WORST_CASE)["question_id"].to_list() == ["a", "b", "c"]
    assert counted(pairs, 5, AT_RANDOM)["question_id"].to_list() == ["a", "b"]
    assert counted(pairs, 5, None)["question_id"].to_list() == ["a", "b"]  # a gate from before policies
    assert observable(pairs, 5)["question_id"].to_list() == ["a", "b", "c"]  # d's window is still open
    assert missing_share(counted(pairs, 5, WORST_CASE)) == pytest.approx(1 / 3)
    assert policy_of('{"missing_labels": "worst_case"}') == WORST_CASE and policy_of("{}") is None
    assert assumption(None) == ASSUMPTIONS[AT_RANDOM] + EARLIER


def _simulation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("missing_label_table",
                                                  ROOT / "infra" / "scripts" / "missing_label_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("law", ["5% missing at random", "by score: 90% of labels above 0.3 never come",
                                 "by correctness: half of wrong answers' labels never come",
                                 "by both: 80% of wrong answers above 0.3, else 5%"])
def test_worst_case_imputation_is_valid_under_every_law_where_leaving_labels_out_is_not(law: str) -> None:
    """The docs' simulation at a fast size (60 calibrations of 1,000 records, δ = 0.05): the worst case certifies
    an invalid threshold in at most 8 of 60 (the 99.9% binomial tail at δ), leaving labels out does so in most runs
    whenever missingness depends on the score or the correctness."""
    sim = _simulation()
    runs = {policy: [sim.one_calibration(np.random.default_rng([7, k]), 1000, sim.LAWS[law], policy)
                     for k in range(60)] for policy in (WORST_CASE, AT_RANDOM)}
    assert sum(bad for bad, _ in runs[WORST_CASE]) <= 8
    if "at random" not in law:
        assert sum(bad for bad, _ in runs[AT_RANDOM]) >= 30


def test_the_label_assumption_reads_the_same_in_the_docs_the_help_and_the_export() -> None:
    """The words the export gives an at_random gate (and the worst case's) are in docs/statistics.md and in `cic
    recalibrate --help`, character for character once line breaks and the help's frame are set aside."""
    import re

    from typer.testing import CliRunner

    from cic.cli import app

    def flat(text: str) -> str:
        return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())

    helped = flat(CliRunner().invoke(app, ["recalibrate", "--help"], terminal_width=400).output)
    docs = flat((ROOT / "docs" / "statistics.md").read_text())
    for words in (ASSUMPTIONS[AT_RANDOM], ASSUMPTIONS[WORST_CASE]):
        assert words in helped, words
        assert words in docs, words
