"""History stays append-only and checked: absurd or zone-less timestamps refused, relabelling refused unless asked
(then recorded and flagged on the gates it touches), records keyed by model, score columns normalised, files
streamed in batches with the same result as in one piece, broken JSON lines named."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cic.cli import app
from cic.errors import UserError
from cic.pipeline.gates.lifecycle import confirm, gates
from cic.pipeline.production.ingest import IngestOptions, ingest_file
from cic.pipeline.production.recalibration import WindowRule, recalibrate_group
from cic.store import Store
from tests.pipeline.test_ingest import T0, records, write
from tests.pipeline.test_recalibration import CONFIG, make_live, only_group

pytestmark = [pytest.mark.faults, pytest.mark.slow]  # multi-step scenarios: the slow tier
NOW = T0 + timedelta(days=1)


def test_a_timestamp_beyond_now_plus_the_skew_is_refused_and_the_skew_is_configurable(tmp_path: Path) -> None:
    future = records().with_columns(pl.Series("timestamp", [T0] * 5 + [NOW + timedelta(days=3650)]))
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(UserError, match=r"record 6 \(question_id 'r5'\): timestamp = 2036-.* lies 3.65e\+03 d in "
                                             r"the future .* allowed clock skew 5 min"):
            ingest_file(store, write(future, tmp_path / "f.parquet"), now=NOW)
        assert store.count("observations") == 0
        near = records().with_columns(pl.Series("timestamp", [T0] * 5 + [NOW + timedelta(minutes=3)]))
        ingest_file(store, write(near, tmp_path / "near.parquet"), now=NOW)  # within the default skew
        later = records().with_columns(pl.Series("timestamp", [T0] * 5 + [NOW + timedelta(hours=2)]))
        with pytest.raises(UserError, match="lies 2 h in the future"):
            ingest_file(store, write(later, tmp_path / "later.parquet"), now=NOW)
        ingest_file(store, write(later, tmp_path / "later.parquet"), IngestOptions(max_skew="3h", replace=True),
                    now=NOW)  # r5 stored 3 min ahead: its new time replaces a stored fact
        old = records().with_columns(pl.Series("timestamp", [datetime(1970, 1, 1, tzinfo=UTC)] * 6))
        with pytest.raises(UserError, match="record 1 .* is before 2000-01-01"):
            ingest_file(store, write(old, tmp_path / "old.parquet"), now=NOW)


def test_naive_timestamps_are_refused_unless_their_zone_is_named(tmp_path: Path) -> None:
    naive = records().with_columns(pl.col("timestamp").dt.replace_time_zone(None))
    text = tmp_path / "n.csv"
    naive.with_columns(pl.col("timestamp").dt.to_string("%Y-%m-%dT%H:%M:%S")).write_csv(text)
    with Store.open(tmp_path / "s.duckdb") as store:
        for path in (write(naive, tmp_path / "n.parquet"), text):
            with pytest.raises(UserError, match="record 1 .*has no time zone.*--timezone"):
                ingest_file(store, path, now=NOW)
        ingest_file(store, text, IngestOptions(timezone="Europe/Berlin"), now=NOW)
        seen = store.read("observations").sort("question_id")["observed_at"][0]
    assert seen == T0 - timedelta(hours=1)  # 09:00 in Berlin in November is 08:00 UTC
    with pytest.raises(UserError, match="timezone = 'Mars/Olympus'"):
        with Store.open(tmp_path / "s.duckdb") as store:
            ingest_file(store, text, IngestOptions(timezone="Mars/Olympus"), now=NOW)


def _stream(n: int, seed: int, start: datetime, offset: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    score = rng.random(n)
    return pl.DataFrame({
        "model": "qwen", "stream": "bot", "question_id": [f"q{i + offset}" for i in range(n)],
        "question": "?", "answer": "a", "timestamp": [start + timedelta(minutes=i) for i in range(n)],
        "score:semantic_entropy": score, "correct": rng.random(n) >= 0.02 + 0.5 * score})


def test_relabelling_is_refused_unless_asked_then_recorded_and_the_live_gate_flagged(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        ingest_file(store, write(_stream(400, 1, T0 - timedelta(days=20)), tmp_path / "week1.parquet"), now=NOW)
        group = only_group(store, "bot")
        live = make_live(store, group.__class__(**{**group.__dict__, "criterion": "human"}))["calibration_id"][0]
        before = store.read("labels")
        flips = before.head(300).select("question_id", ~pl.col("aligned")).rename({"aligned": "correct"})
        labels = flips.with_columns(model=pl.lit("qwen"), stream=pl.lit("bot"))
        with pytest.raises(UserError, match=r"record 1 \(question_id 'q0'\): would change the stored human label .*"
                                             r"\(300 stored label\(s\) in all\).*--relabel"):
            ingest_file(store, write(labels, tmp_path / "flips.csv"), now=NOW)
        assert store.read("labels").equals(before) and store.count("label_events") == 0
        same = before.head(5).select("question_id", pl.col("aligned").alias("correct"))
        ingest_file(store, write(same.with_columns(model=pl.lit("qwen"), stream=pl.lit("bot")),
                                 tmp_path / "same.csv"), now=NOW)  # labels that change nothing are fine

        stats = ingest_file(store, write(labels, tmp_path / "flips.csv"), IngestOptions(relabel=True), now=NOW)
        assert stats.relabelled == 300 and stats.flagged_gates == [live]
        events = store.read("label_events")
        assert events.height == 300 and set(events["source"]) == {"flips.csv"}
        assert (events["old_aligned"] != events["new_aligned"]).all()
        row = gates(store).filter(calibration_id=live).row(0, named=True)
        assert row["state"] == "live" and row["alerts"][0].startswith("labels changed under this gate: 300 label(s)")
        # the next recalibration of that key says so on every candidate
        ingest_file(store, write(_stream(100, 2, T0 - timedelta(days=2), offset=1000), tmp_path / "w2.parquet"),
                    now=NOW)
        human = group.__class__(**{**group.__dict__, "criterion": "human"})
        result = recalibrate_group(store, human, CONFIG, WindowRule())
        candidate = result.rows.row(0, named=True)
        assert any(a.startswith(f"live gate {live[:12]}: labels changed") for a in result.alerts_of(candidate))
    listed = CliRunner().invoke(app, ["gate", "list", "--db", str(db), "--state", "live"])
    assert f"{live[:12]} alert: labels changed under this gate: 300 label(s)" in " ".join(listed.output.split())


@pytest.mark.parametrize("change", ["relabel", "replace"])
def test_a_change_under_a_live_cascade_flags_its_gate_as_it_flags_a_single_one_and_the_export_says_why(
        tmp_path: Path, change: str) -> None:
    """A cascade certified on two models' streams: relabelling (or replacing) questions it was certified on in
    its second stage flags the system gate as it flags that model's single gate — the export serves nothing for
    the key and says why (unflagged, the gate no longer re-certified and the whole export was refused), a relabelled
    one cannot be confirmed back (refused in a single gate's words), and the next recalibration of the key pages on
    its candidate."""
    from cic.pipeline.config import CalibrationConfig, CascadeConfig
    from cic.pipeline.gates.calibrate_store import calibrate_store
    from cic.pipeline.gates.system_gates import system_gates
    from cic.pipeline.production.recalibration import recalibrate_store
    from tests.support.pipeline_data import served_systems

    db = tmp_path / "s.duckdb"
    config = CalibrationConfig(alphas=(0.3,), bounds=("cp",), searches=("fixed_sequence",), n_splits=2,
                               cascades=(CascadeConfig(name="sb", models=("small", "big"),
                                                       estimator="semantic_entropy"),))
    streams = {m: _stream(400, seed, T0 - timedelta(days=20)).with_columns(model=pl.lit(m))
               for m, seed in (("small", 1), ("big", 2))}
    with Store.open(db) as store:
        for model, frame in streams.items():
            ingest_file(store, write(frame, tmp_path / f"{model}.parquet"), now=NOW)
        keys = store.read("runs").get_column("run_key").to_list()
    calibrate_store(str(db), keys, config)
    with Store.open(db) as store:
        (cascade,) = system_gates(store).filter(state="live").get_column("calibration_id").to_list()
        big = streams["big"].head(3)
        if change == "relabel":  # another criterion's labels of the same questions changed: not the cascade's
            other = big.select("model", "stream", "question_id", "correct")
            ingest_file(store, write(other, tmp_path / "other.csv"), IngestOptions(label_name="review"), now=NOW)
            flipped = other.with_columns(~pl.col("correct"))
            elsewhere = ingest_file(store, write(flipped, tmp_path / "other2.csv"),
                                    IngestOptions(label_name="review", relabel=True), now=NOW)
            assert elsewhere.relabelled == 3 and cascade not in elsewhere.flagged_gates
            flips = big.select("model", "stream", "question_id", ~pl.col("correct"))
            stats = ingest_file(store, write(flips, tmp_path / "flips.csv"), IngestOptions(relabel=True), now=NOW)
        else:
            resent = big.with_columns(answer=pl.lit("another answer"))
            stats = ingest_file(store, write(resent, tmp_path / "resent.parquet"), IngestOptions(replace=True),
                                now=NOW)
        assert cascade in stats.flagged_gates and len(stats.flagged_gates) == 2  # and big's single gate
        (alert,) = system_gates(store).filter(calibration_id=cascade).row(0, named=True)["alerts"]
        said = {"relabel": "labels changed under this gate: 3 label(s)",
                "replace": "records replaced under this gate: 3 record(s)"}[change]
        assert alert.startswith(said)
        (served,) = served_systems(store)
        assert served["serve"] == "nothing" and f"live system gate {cascade[:12]} is flagged ({said}" in \
            served["reason"]
        if change == "relabel":  # its certified data changed: nobody confirms it back, in a single gate's words
            with pytest.raises(UserError, match=rf"system gate {cascade[:12]} .*: its calibration pairs are no longer "
                                                 r"in the store \(400 of its 400 questions rebuilt in every stage; "
                                                 r"their fingerprint differs\); refusing to serve it \(recalibrate"):
                confirm(store, cascade, reason="looked: fine")
        for model in streams:
            later = _stream(100, 7, T0 - timedelta(days=2), offset=1000).with_columns(model=pl.lit(model))
            ingest_file(store, write(later, tmp_path / f"{model}-2.parquet"), now=NOW)
        night = recalibrate_store(store, keys, config, 0.05, WindowRule())
        (candidate,) = night.systems
        assert [a.kind.severity for a in candidate.alerts if f"live gate {cascade[:12]}: {said}" in a] == ["page"]


CHANGES = {"question": pl.lit("what else?"), "answer": pl.lit("b"),
           "timestamp": pl.col("timestamp") + timedelta(seconds=1), "score:semantic_entropy": pl.lit(0.5)}


@pytest.mark.parametrize("field", list(CHANGES))
def test_a_resent_record_that_changes_a_stored_fact_is_refused_unless_replaced_then_recorded_and_paged(
        tmp_path: Path, field: str) -> None:
    """Re-sending stored records unchanged is idempotent; any field changed is refused naming record, field, old
    and new value, the store untouched; with `replace` each change is a record event, the live gate whose window
    held the records is flagged, and the next recalibration of its key pages."""
    db = tmp_path / "s.duckdb"
    first = _stream(400, 1, T0 - timedelta(days=20))
    with Store.open(db) as store:
        ingest_file(store, write(first, tmp_path / "week1.parquet"), now=NOW)
        group = only_group(store, "bot")
        human = group.__class__(**{**group.__dict__, "criterion": "human"})
        live = make_live(store, human)["calibration_id"][0]
        ingest_file(store, write(first, tmp_path / "again.parquet"), now=NOW)  # the same records: nothing changes
        tables = {t: store.read(t) for t in ("questions", "generations", "observations", "scores", "labels")}
        changed = first.with_columns(pl.when(pl.int_range(pl.len()) < 3).then(CHANGES[field])
                                     .otherwise(pl.col(field)).alias(field))
        path = write(changed, tmp_path / "changed.parquet")
        with pytest.raises(UserError, match=rf"record 1 \(question_id 'q0'\): would change the stored {field} of "
                                             r"model 'qwen', stream 'bot' from .* \(3 field\(s\) of 3 stored "
                                             r"record\(s\) in all\).*--replace"):
            ingest_file(store, path, now=NOW)
        assert all(store.read(t).equals(before) for t, before in tables.items())
        assert store.count("record_events") == 0

        stats = ingest_file(store, path, IngestOptions(replace=True), now=NOW)
        assert stats.replaced == 3 and stats.flagged_gates == [live]
        events = store.read("record_events").sort("question_id")
        assert events["question_id"].to_list() == ["q0", "q1", "q2"] and set(events["field"]) == {field}
        assert (events["old_value"] != events["new_value"]).all() and set(events["source"]) == {"changed.parquet"}
        row = gates(store).filter(calibration_id=live).row(0, named=True)
        assert row["alerts"][0].startswith("records replaced under this gate: 3 record(s)")
        ingest_file(store, write(_stream(100, 2, T0 - timedelta(days=2), offset=1000), tmp_path / "w2.parquet"),
                    now=NOW)
        result = recalibrate_group(store, human, CONFIG, WindowRule())
        alerts = result.alerts_of(result.rows.row(0, named=True))
        assert [a.kind.severity for a in alerts if f"live gate {live[:12]}: records replaced" in a] == ["page"]
        again = ingest_file(store, path, now=NOW)  # the replaced values are the stored ones now
        assert again.replaced == 0 and store.count("record_events") == 3


def test_the_cli_refuses_a_changed_record_in_one_line_and_says_what_replace_did(tmp_path: Path) -> None:
    db, first = tmp_path / "s.duckdb", _stream(20, 1, T0 - timedelta(days=2))
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", str(write(first, tmp_path / "a.csv")), "--db", str(db)]).exit_code == 0
    path = write(first.with_columns(pl.lit("b").alias("answer")), tmp_path / "b.csv")
    refused = runner.invoke(app, ["ingest", str(path), "--db", str(db)])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) <= 3
    assert "would change the stored answer" in " ".join(refused.output.split())
    done = runner.invoke(app, ["ingest", str(path), "--db", str(db), "--replace", "--no-mlflow"])
    said = " ".join(done.output.split())
    assert done.exit_code == 0, said
    assert "20 already stored (20 replaced, 0 unchanged)" in said and "replaced: 20 stored record(s)" in said


def test_two_models_on_one_stream_keep_their_own_question_text(tmp_path: Path) -> None:
    a = records(2)
    b = records(2).with_columns(model=pl.lit("llama"), question=pl.Series(["other 0?", "other 1?"]))
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(pl.concat([a, b]), tmp_path / "both.parquet"), now=NOW)
        questions = store.read("questions").filter(question_id="r0")
    assert dict(questions.select("split", "question").iter_rows()) == {"production:qwen": "question 0?",
                                                                        "production:llama": "other 0?"}


def test_score_columns_are_normalised_and_names_that_collide_are_refused(tmp_path: Path) -> None:
    spaced = records().rename({"score:semantic_entropy": "score: semantic_entropy "})
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(spaced, tmp_path / "spaced.parquet"), now=NOW)
        assert set(store.read("scores")["estimator"]) == {"semantic_entropy", "predictive_entropy"}
        both = records().with_columns(pl.col("score:semantic_entropy").alias("score:semantic_entropy "))
        with pytest.raises(UserError, match="columns 'score:semantic_entropy' and 'score:semantic_entropy ' both name "
                                             "estimator 'semantic_entropy'"):
            ingest_file(store, write(both, tmp_path / "both.parquet"), now=NOW)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_batches_give_what_one_piece_gives_and_repeats_across_batches_are_caught(tmp_path: Path,
                                                                                 suffix: str) -> None:
    frame = records(7)
    tables = ("runs", "questions", "generations", "scores", "labels", "observations")
    path = write(frame, tmp_path / f"t{suffix}")
    with Store.open(tmp_path / "one.duckdb") as one, Store.open(tmp_path / "many.duckdb") as many:
        ingest_file(one, path, now=NOW)
        stats = ingest_file(many, path, now=NOW, batch_rows=2)
        assert stats.records == 7 and stats.labels == 7
        for table in tables:
            drop = [c for c in ("created_at",) if c in one.read(table).columns]
            assert one.read(table).drop(drop).equals(many.read(table).drop(drop)), table
        repeated = frame.with_columns(pl.Series("question_id", ["r0", "r1", "r2", "r3", "r4", "r5", "r1"]))
        with pytest.raises(UserError, match="records 2, 7 repeat model 'qwen', stream 'support-bot', "
                                             "question_id 'r1'"):
            ingest_file(many, write(repeated, tmp_path / f"rep{suffix}"), now=NOW, batch_rows=2)


def test_a_broken_jsonl_line_is_named_by_its_number(tmp_path: Path) -> None:
    path = write(records(4), tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-5]  # a line cut short, as a crashed writer leaves it
    path.write_text("\n".join(lines) + "\n")
    with Store.open(tmp_path / "s.duckdb") as store, pytest.raises(UserError, match="line 3 is not JSON"):
        ingest_file(store, path, now=NOW)


def test_a_large_ingest_killed_between_commits_blocks_recalibration_until_rerun(tmp_path: Path) -> None:
    """kill -9 (of the real process, at a fixed point: after its first commit) of an ingest written in steps."""
    import os
    import subprocess
    import sys

    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.production.ingest import unfinished_ingests
    from cic.pipeline.production.recalibration import recalibrate_store

    path = write(_stream(40, 3, T0 - timedelta(days=3)), tmp_path / "big.parquet")
    db = tmp_path / "s.duckdb"
    code = (
        "import os, signal, sys\n"
        "from datetime import datetime, UTC\n"
        "import cic.pipeline.production.ingest as ingest\nimport cic.pipeline.production.ingest_journal as journal\n"
        "from cic.store import Store\n"
        "real, calls = journal.write_step, []\n"
        "def killing(*args, **kwargs):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real(*args, **kwargs)\n"
        "journal.write_step = killing\n"
        f"with Store.open({str(db)!r}) as store:\n"
        f"    ingest.ingest_file(store, {str(path)!r}, now=datetime.fromisoformat({NOW.isoformat()!r}), "
        "batch_rows=10, commit_records=10)\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert child.returncode == -9, child.stderr
    left = list(tmp_path.glob(".cic-scratch-ingest-s.duckdb-*"))
    assert len(left) == 1  # kill -9 skips the cleanup of its scratch directory
    stranger = tmp_path / ".cic-scratch-ingest-other.duckdb-x"  # another store's: not this store's to remove
    stranger.mkdir()
    with Store.open(db) as store:
        assert unfinished_ingests(store) == [str(path.resolve())]
        assert 0 < store.count("generations") < 40  # partly written: exactly why recalibration must wait
        with pytest.raises(UserError, match="cut off before its last commit.*rerun `cic ingest"):
            recalibrate_store(store, store.read("runs")["run_key"].to_list(), CalibrationConfig(), 0.01,
                              WindowRule())
        moved = path.rename(tmp_path / "renamed.parquet")  # the journal knows the file by its bytes, not its name
        stats = ingest_file(store, moved, now=NOW, batch_rows=10, commit_records=10)  # the rerun completes it
        assert stats.records == 40 and unfinished_ingests(store) == []
        assert store.count("generations") == 40 and store.count("labels") == 40 and store.count("scores") == 40
        assert store.read("ingests").select("state", "file").rows() == [("done", str(moved.resolve()))]
    assert not left[0].exists() and list(tmp_path.glob(".cic-scratch-*")) == [stranger]  # removed by the rerun


def _cut_off(tmp_path: Path, db: Path, *, fail_at: int, replace: bool = False) -> tuple[Path, dict[str, int],
                                                                                      pl.DataFrame]:
    """A store with 20 labelled records, then a 60-record file (those 20 again, 5 of them relabelled — and with
    `replace` every one of them with another answer, score and time —, and 40 new ones in a new stream) written
    in steps of 10 and cut off by a full disk at step `fail_at`."""
    import cic.pipeline.production.ingest_journal as journal

    before = _stream(20, 5, T0 - timedelta(days=5))
    with Store.open(db) as store:
        ingest_file(store, write(before, tmp_path / "before.parquet"), now=NOW - timedelta(hours=2))
        counts = store.counts()
        labels = store.read("labels")
    flipped = before.with_columns(pl.when(pl.int_range(pl.len()) < 5).then(~pl.col("correct"))
                                  .otherwise(pl.col("correct")).alias("correct"))
    if replace:
        flipped = flipped.with_columns(pl.lit("z").alias("answer"), pl.col("score:semantic_entropy") + 0.1,
                                       pl.col("timestamp") + timedelta(seconds=1))
    big = pl.concat([flipped, _stream(40, 6, T0 - timedelta(days=3), offset=100).with_columns(stream=pl.lit("bot2"))])
    path = write(big, tmp_path / "big.parquet")
    real, calls = journal.write_step, []

    def failing(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == fail_at:
            raise OSError("No space left on device")
        real(*args, **kwargs)

    with Store.open(db) as store, pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal, "write_step", failing)
        with pytest.raises(OSError):
            ingest_file(store, path, IngestOptions(relabel=True, replace=replace), now=NOW, batch_rows=10,
                        commit_records=10)
    return path, counts, labels


@pytest.mark.parametrize("staged", [True, False])
def test_a_cut_off_ingest_is_abandoned_in_one_transaction(tmp_path: Path, staged: bool) -> None:
    import shutil

    from cic.pipeline.config import CalibrationConfig
    from cic.pipeline.production.ingest import file_digest, staging_dir
    from cic.pipeline.production.recalibration import recalibrate_store

    db = tmp_path / "s.duckdb"
    path, counts, labels = _cut_off(tmp_path, db, fail_at=18)  # 17 of 18 steps committed: labels relabelled too
    short = file_digest(path)[:12]
    with Store.open(db) as store:
        assert store.count("label_events") == 5 and store.count("observations") == 60
        assert store.read("labels").join(labels, on=["run_key", "question_id", "criterion"]) \
            .filter(pl.col("aligned") != pl.col("aligned_right")).height == 5
        with pytest.raises(UserError, match=rf"cut off before its last commit.*(--complete {short}|rerun `cic "
                                             rf"ingest).*`cic ingest --abandon {short} --db"):
            recalibrate_store(store, store.read("runs")["run_key"].to_list(), CalibrationConfig(), 0.01, WindowRule())
        if not staged:
            shutil.rmtree(staging_dir(store, file_digest(path)))
        untouched = store.counts()
    runner = CliRunner()
    bad = runner.invoke(app, ["ingest", "--abandon", "zzzzzz", "--db", str(db)])
    assert bad.exit_code == 2 and "--abandon = 'zzzzzz': names no ingest journal entry" in bad.output
    both = runner.invoke(app, ["ingest", str(path), "--abandon", short, "--db", str(db)])
    assert both.exit_code == 2 and "give exactly one of" in both.output
    with Store.open(db) as store:
        assert store.counts() == untouched  # refused: nothing changed
    done = runner.invoke(app, ["ingest", "--abandon", short, "--db", str(db)], env={"CIC_PROGRESS_AFTER_S": "0"})
    assert done.exit_code == 0, done.output
    assert f"abandoning ingest {short} of {path.resolve()} (60 record(s)): removing what it stored" in done.output
    assert f"abandon {short}: 1/18 (5.6%)" in done.output and f"abandon {short}: 18/18 (100.0%)" in done.output
    assert f"ingest {short} abandoned: removed" in done.output
    with Store.open(db) as store:
        after = store.counts()
        assert {t: after[t] for t in counts if t != "ingests"} == {t: n for t, n in counts.items() if t != "ingests"}
        assert store.read("labels").equals(labels)  # relabelled labels have their old value back
        assert store.read("ingests").filter(state="abandoned").height == 1
        assert not staging_dir(store, file_digest(path)).exists()
        recalibrate_store(store, store.read("runs")["run_key"].to_list(), CalibrationConfig(), 0.01, WindowRule())
    again = runner.invoke(app, ["ingest", "--abandon", short, "--db", str(db)])
    assert again.exit_code == 2 and "is abandoned, not unfinished" in again.output


@pytest.mark.parametrize("fail_at", [10, 18])
def test_abandoning_a_cut_off_ingest_keeps_what_a_later_complete_file_holds(tmp_path: Path, fail_at: int) -> None:
    """Cut off (records only at step 10; its relabels too at 18), then superseded by a complete file that holds
    every record again plus 5 more, then abandoned: nothing the complete ingest holds is removed or reverted."""
    from cic.pipeline.production.ingest import file_digest

    db = tmp_path / "s.duckdb"
    path, _, _ = _cut_off(tmp_path, db, fail_at=fail_at)
    more = _stream(5, 7, T0 - timedelta(days=2), offset=500).with_columns(stream=pl.lit("bot2"))
    full = write(pl.concat([pl.read_parquet(path), more]), tmp_path / "full.parquet")
    with Store.open(db) as store:
        ingest_file(store, full, IngestOptions(relabel=True), now=NOW + timedelta(hours=1), batch_rows=10,
                    commit_records=10)
        held = {t: store.read(t).drop("created_at", "ingest", "source", strict=False).sort(pl.all())
                for t in ("observations", "labels", "scores", "generations")}
        assert store.count("observations") == 65 and store.count("labels") == 65
    done = CliRunner().invoke(app, ["ingest", "--abandon", file_digest(path)[:12], "--db", str(db)])
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        for table, rows in held.items():  # every row the complete ingest holds, with its values
            assert store.read(table).drop("created_at", "ingest", "source", strict=False).sort(pl.all()).equals(rows)
        assert dict(store.read("ingests").select("state", "records").iter_rows()) == {"done": 20, "abandoned": 60} \
            or sorted(store.read("ingests")["state"].to_list()) == ["abandoned", "done", "done"]


def test_a_cut_off_ingest_is_completed_from_its_staged_data_without_its_file(tmp_path: Path) -> None:
    from cic.pipeline.production.ingest import file_digest, staging_dir, unfinished_ingests

    db = tmp_path / "s.duckdb"
    path, _, _ = _cut_off(tmp_path, db, fail_at=4)
    digest = file_digest(path)
    short = digest[:12]
    assert (tmp_path / f".cic-ingest-{db.name}-{digest[:16]}" / "manifest.json").is_file()  # checked and staged
    path.unlink()  # the file is gone
    done = CliRunner().invoke(app, ["ingest", "--complete", short, "--db", str(db)])
    assert done.exit_code == 0, done.output
    assert f"completing ingest {short}" in done.output and "committing its remaining staged steps" in done.output
    with Store.open(db) as store:
        assert unfinished_ingests(store) == [] and not staging_dir(store, digest).exists()
        assert store.count("observations") == 60 and store.count("labels") == 60 and store.count("scores") == 60
        assert store.count("label_events") == 5 and store.read("ingests").filter(state="done").height == 2
    missing = CliRunner().invoke(app, ["ingest", "--complete", short, "--db", str(db)])
    assert missing.exit_code == 2 and "is done, not unfinished" in missing.output


def test_abandoning_a_cut_off_ingest_that_replaced_records_puts_their_old_values_back(tmp_path: Path) -> None:
    """Its 20 re-sent records had another answer, score and time (--replace, recorded and flagged); abandoned
    after every step committed, the store holds exactly what it held before, and no event of it is left."""
    from cic.pipeline.production.ingest import abandon_ingest, file_digest

    db = tmp_path / "s.duckdb"
    tables = ("questions", "generations", "scores", "observations", "labels")
    (tmp_path / "first").mkdir()
    path, _, _ = _cut_off(tmp_path / "first", db, fail_at=18, replace=True)  # 17 of 18 steps committed
    with Store.open(db) as store:
        assert store.count("record_events") == 60  # 20 records x answer, score, timestamp
        replaced = store.read("generations").filter(pl.col("text") == "z").height
        assert replaced == 20
        abandon_ingest(store, file_digest(path)[:12])
        assert store.count("record_events") == 0 and store.count("label_events") == 0
        after = {t: store.read(t).drop("created_at", "ingest", "source", strict=False).sort(pl.all()) for t in tables}
    fresh = tmp_path / "fresh.duckdb"
    with Store.open(fresh) as store:  # the 20 records alone, as _cut_off ingested them before
        ingest_file(store, tmp_path / "first" / "before.parquet", now=NOW - timedelta(hours=2))
        want = {t: store.read(t).drop("created_at", "ingest", "source", strict=False).sort(pl.all()) for t in tables}
    for table in tables:
        assert after[table].equals(want[table]), table


def test_completing_a_cut_off_ingest_does_not_overwrite_what_a_later_ingest_stored(tmp_path: Path) -> None:
    """Cut off after 3 of 18 steps; a later ingest labels three of its records the other way and answers one of
    them otherwise; completing (from staged data, or by rerunning the file) is refused naming the later value,
    the store untouched, until --relabel and --replace let the cut-off file win — recorded as events."""
    from cic.pipeline.production.ingest import file_digest

    db = tmp_path / "s.duckdb"
    path, _, _ = _cut_off(tmp_path, db, fail_at=4)
    short = file_digest(path)[:12]
    big = pl.read_parquet(path)
    later = big.filter(pl.col("question_id").is_in(["q100", "q101", "q115"])).with_columns(
        ~pl.col("correct"), pl.when(pl.col("question_id") == "q115").then(pl.lit("other")).otherwise("answer")
        .alias("answer"))
    with Store.open(db) as store:
        ingest_file(store, write(later, tmp_path / "later.parquet"), now=NOW + timedelta(hours=1))
        before = store.counts()
        with pytest.raises(UserError, match=r"record \d+ \(question_id 'q115'\): a later ingest stored answer "
                                             r"'other' for model 'qwen', stream 'bot2', where this file says 'a'.*"
                                             r"--replace with the completion"):
            ingest_file(store, path, IngestOptions(relabel=True), now=NOW, batch_rows=10, commit_records=10)
        assert store.counts() == before
    runner = CliRunner()
    refused = runner.invoke(app, ["ingest", "--complete", short, "--db", str(db)])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2, said
    assert "a later ingest stored human label" in said and f"--abandon {short}" in said
    with Store.open(db) as store:
        assert store.counts() == before
    done = runner.invoke(app, ["ingest", "--complete", short, "--db", str(db), "--relabel", "--replace"])
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        assert store.read("ingests", state="writing").height == 0
        ours = big.filter(pl.col("question_id").is_in(["q100", "q101", "q115"])).sort("question_id")
        stored = store.read("labels").filter(pl.col("question_id").is_in(["q100", "q101", "q115"])).sort("question_id")
        assert stored["aligned"].to_list() == ours["correct"].to_list()  # the completed file's values won
        events = store.read("label_events").filter(pl.col("question_id").is_in(["q100", "q101", "q115"]))
        assert events.height == 3 and set(events["source"]) == {"big.parquet"}
        assert store.read("record_events").select("question_id", "field", "old_value", "new_value").rows() == [
            ("q115", "answer", "other", "a")]


def test_a_cut_off_ingest_rerun_without_its_staged_data_commits_only_the_steps_it_lacks(tmp_path: Path) -> None:
    """Cut off after 9 of 18 steps, staged data removed, the file ingested again: it stages the same steps and
    commits the 9 it lacks (the journal counts committed steps in their own transactions), ending with exactly the
    rows a completion from staged data gives."""
    import shutil

    import cic.pipeline.production.ingest as ingest
    import cic.pipeline.production.ingest_journal as journal

    reference = tmp_path / "reference"
    reference.mkdir()
    ref_path, _, _ = _cut_off(reference, reference / "s.duckdb", fail_at=10)
    with Store.open(reference / "s.duckdb") as store:
        ingest.complete_ingest(store, ingest.file_digest(ref_path)[:12])
    db = tmp_path / "s.duckdb"
    path, _, _ = _cut_off(tmp_path, db, fail_at=10)
    real, written = journal.write_step, []
    with Store.open(db) as store, pytest.MonkeyPatch.context() as patch:
        assert store.read("ingests", state="writing").get_column("committed").to_list() == [9]
        shutil.rmtree(ingest.staging_dir(store, ingest.file_digest(path)))
        patch.setattr(journal, "write_step", lambda *a, **k: (written.append(a[1]), real(*a, **k)))
        ingest_file(store, path, IngestOptions(relabel=True), now=NOW, batch_rows=10, commit_records=10)
        assert len(written) == 9 and ingest.unfinished_ingests(store) == []
        got = {t: store.read(t) for t in ("questions", "generations", "scores", "labels", "observations", "runs")}
    with Store.open(reference / "s.duckdb", read_only=True) as store:
        for table, frame in got.items():
            assert frame.drop("created_at", strict=False).equals(
                store.read(table).drop("created_at", strict=False)), table


def test_a_rerun_that_stages_other_steps_redoes_every_step(tmp_path: Path) -> None:
    """Cut off after 9 steps of 10 records, staged data removed, rerun in steps of 20: its plan differs from the
    journal's, so nothing is skipped (skipping by count would skip steps holding other records)."""
    import shutil

    import cic.pipeline.production.ingest as ingest
    import cic.pipeline.production.ingest_journal as journal

    db = tmp_path / "s.duckdb"
    path, _, _ = _cut_off(tmp_path, db, fail_at=10)
    real, written = journal.write_step, []
    with Store.open(db) as store, pytest.MonkeyPatch.context() as patch:
        shutil.rmtree(ingest.staging_dir(store, ingest.file_digest(path)))
        patch.setattr(journal, "write_step", lambda *a, **k: (written.append(a[1]), real(*a, **k)))
        ingest_file(store, path, IngestOptions(relabel=True), now=NOW, batch_rows=10, commit_records=20)
        plan = json.loads(store.read("ingests", digest=ingest.file_digest(path)).get_column("plan")[0])
        assert len(written) == len(plan) < 18 and ingest.unfinished_ingests(store) == []
        assert store.count("observations") == 60 and store.count("labels") == 60


@pytest.mark.faults
def test_an_ingest_that_fills_a_stored_null_score_is_a_change_refused_without_replace(tmp_path: Path) -> None:
    """A record stored with no score (an estimator could not compute it: routine), ingested again with 0.5: a
    change to stored history, refused without --replace and nothing written (null compares as a value)."""
    stream = _stream(50, 1, T0 - timedelta(days=3))
    with Store.open(tmp_path / "s.duckdb") as store:
        ingest_file(store, write(stream.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None)
                                                     .otherwise(pl.col("score:semantic_entropy"))
                                                     .alias("score:semantic_entropy")), tmp_path / "a.parquet"),
                    now=NOW)
        before = store.read("scores")
        with pytest.raises(UserError, match="--replace"):
            ingest_file(store, write(stream, tmp_path / "b.parquet"), now=NOW)
        assert store.read("scores").equals(before)
