"""The landing table (`cic.store.landing`, `cic.store.lake`): batches land whole, loads are exactly once by data
file, concurrent writers lose nothing, a writer killed mid-append leaves no partial batch, and bad places or
layouts are refused in one line with the store unchanged."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from cic.errors import UserError
from cic.store import Store, lake
from cic.store.landing import FIELD, check_landing_uri, land, landed_table, load_landing

pytestmark = pytest.mark.faults


def batch(run: str, first: int, n: int, *, value: float = 0.5) -> dict[str, pl.DataFrame]:
    """One worker batch of `n` questions: a greedy generation, a score and a label each."""
    ids = [str(i) for i in range(first, first + n)]
    generations = pl.DataFrame({
        "run_key": run, "question_id": ids, "sample_index": 0, "text": [f"answer {i}" for i in ids], "n_tokens": 2,
        "logprob_sum": -1.0, "logprob_mean": -0.5, "is_greedy": True, "option_probs": None, "flags": [[]] * n},
        schema_overrides={"sample_index": pl.Int32, "n_tokens": pl.Int32, "option_probs": pl.List(pl.Float64),
                          "flags": pl.List(pl.String)})
    scores = pl.DataFrame({"run_key": run, "question_id": ids, "estimator": "predictive_entropy", "value": value})
    labels = pl.DataFrame({"run_key": run, "question_id": ids, "criterion": "exact_match",
                           "aligned": [i % 2 == 0 for i in range(n)], "value": 1.0})
    return {"generations": generations, "scores": scores, "labels": labels}


def counts(db: Path) -> dict[str, int]:
    with Store.open(db) as store:
        return {k: v for k, v in store.counts().items() if k in ("generations", "scores", "labels", "lake_files")}


def test_a_load_takes_each_landed_row_once_and_a_second_load_adds_nothing(tmp_path: Path) -> None:
    table = tmp_path / "landing"
    assert land(table, batch("r", 0, 3)) == 0 and land(table, batch("r", 3, 4)) == 1
    with Store.open(tmp_path / "cic.duckdb") as store:
        first = load_landing(store, table)
        assert (first.version, first.files, first.rows) == (1, 2, {"generations": 7, "scores": 7, "labels": 7})
        again = load_landing(store, table)
        assert again.files == 0 and sum(again.rows.values()) == 0
        land(table, batch("r", 7, 2))
        later = load_landing(store, table)  # only what landed since
        assert (later.version, later.files, later.rows["scores"]) == (2, 1, 2)
        assert store.count("scores") == 9 and store.count("lake_files") == 3


def test_a_batch_landed_twice_keeps_one_row_per_key_the_later_one(tmp_path: Path) -> None:
    """A retried batch (its first worker died after landing) lands again; the later append wins."""
    table = tmp_path / "landing"
    land(table, batch("r", 0, 3, value=0.1))
    time.sleep(0.01)  # the retry lands later
    land(table, batch("r", 0, 3, value=0.9))
    with Store.open(tmp_path / "cic.duckdb") as store:
        load_landing(store, table)
        scores = store.read("scores")
    assert scores.height == 3 and scores.get_column("value").to_list() == [0.9] * 3


def test_nothing_landed_yet_loads_nothing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "cic.duckdb") as store:
        assert load_landing(store, tmp_path / "not-yet").version == -1
        (tmp_path / "empty").mkdir()
        assert load_landing(store, tmp_path / "empty").files == 0


def test_a_load_cut_off_midway_stores_nothing_and_the_next_load_stores_all(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from cic.store import landing

    table = tmp_path / "landing"
    for i in range(3):
        land(table, batch("r", 3 * i, 3))
    real = lake.read_files
    calls: list[int] = []

    def dies_on_the_second_step(t: object, files: object, field: str) -> pa.Table:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the flow killed between two steps of one load
        return real(t, files, field)  # type: ignore[arg-type]

    monkeypatch.setattr(landing, "FILES_PER_STEP", 1)
    monkeypatch.setattr(lake, "read_files", dies_on_the_second_step)
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store, pytest.raises(KeyboardInterrupt):
        load_landing(store, table)
    assert counts(db) == {"generations": 0, "scores": 0, "labels": 0, "lake_files": 0}
    monkeypatch.setattr(lake, "read_files", real)
    with Store.open(db) as store:
        assert load_landing(store, table).files == 3
    assert counts(db) == {"generations": 9, "scores": 9, "labels": 9, "lake_files": 3}


def _writer(table: str, worker: int, commits: int, rows: int) -> None:
    for c in range(commits):
        land(table, batch(f"w{worker}", c * rows, rows))


def test_four_writer_processes_lose_no_batch(tmp_path: Path) -> None:
    table = str(tmp_path / "landing")
    land(table, batch("w0", 10_000, 1))  # the table exists before the writers race
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(table, w, 4, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with Store.open(tmp_path / "cic.duckdb") as store:
        load_landing(store, table)
        assert store.count("scores") == 4 * 4 * 25 + 1
        assert store.sql("SELECT count(DISTINCT run_key) FROM generations")[0][0] == 4


APPEND_FOREVER = """
import sys
sys.path.insert(0, {root!r})
from tests.store.test_landing import batch
from cic.store.landing import land
i = 0
while True:
    land({table!r}, batch("r", i * 500, 500))
    i += 1
"""


def test_a_writer_killed_mid_append_leaves_whole_batches_only(tmp_path: Path) -> None:
    table = tmp_path / "landing"
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", APPEND_FOREVER.format(root=root, table=str(table))])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(table.glob("_delta_log/*.json"))) < 3:
            time.sleep(0.05)
        time.sleep(0.137)  # somewhere inside a later append
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    version = lake.open_table(table, FIELD).version()
    with Store.open(tmp_path / "cic.duckdb") as store:
        load_landing(store, table)
        assert store.count("scores") == 500 * (version + 1)  # whole batches: every committed one, no other rows
        assert store.count("generations") == store.count("labels") == store.count("scores")


def test_a_landed_data_file_that_is_gone_stops_the_load_and_stores_nothing(tmp_path: Path) -> None:
    """A VACUUM run on the landing table before the flow loaded it: the load names the field and version in one
    line and stores nothing of the step; with the file restored the next load stores every row once."""
    table, db = tmp_path / "landing", tmp_path / "cic.duckdb"
    land(table, batch("r", 0, 3))
    land(table, batch("r", 3, 4))
    kept = sorted(table.glob("*.parquet"), key=lambda f: f.stat().st_mtime_ns)[0]
    kept.rename(tmp_path / "aside")
    with Store.open(db) as store, pytest.raises(UserError) as info:
        load_landing(store, table)
    text = str(info.value)
    assert text.startswith(f"{FIELD} = ") and "version 1 names a data file that cannot be read" in text
    assert "\n" not in text and counts(db) == dict.fromkeys(("generations", "scores", "labels", "lake_files"), 0)
    (tmp_path / "aside").rename(kept)
    with Store.open(db) as store:
        assert load_landing(store, table).rows == {"generations": 7, "scores": 7, "labels": 7}


@pytest.mark.parametrize(("value", "words"), [
    ("", "path or URI of a Delta table"), ("ftp://host/x", "not a Delta table URI"), ("s3://", "not a Delta table URI"),
    ("/no/such/dir/landing", "does not exist")])
def test_a_bad_landing_place_is_refused_in_one_line(value: str, words: str) -> None:
    with pytest.raises(UserError, match=words) as info:
        check_landing_uri(value)
    assert FIELD in str(info.value) and "\n" not in str(info.value)


def test_a_file_or_a_directory_of_other_things_is_not_a_landing_table(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"x")
    with pytest.raises(UserError, match="is a file"):
        check_landing_uri(str(tmp_path / "a.parquet"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="no _delta_log"):
        landed_table(tmp_path / "dir")


def test_a_table_of_another_layout_is_refused_and_the_store_is_unchanged(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    other = tmp_path / "other"
    write_deltalake(str(other), pa.table({"model": ["m"], "stream": ["s"]}), mode="append")
    db = tmp_path / "cic.duckdb"
    table = tmp_path / "landing"
    land(table, batch("r", 0, 2))
    with Store.open(db) as store:
        load_landing(store, table)
    before = counts(db)
    with Store.open(db) as store, pytest.raises(UserError, match="not a CIC landing table: it lacks column") as info:
        load_landing(store, other)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="another layout"):
        lake.append(other, pa.table({"zz": [1]}), FIELD)
    assert counts(db) == before


def test_a_column_of_another_type_is_named(tmp_path: Path) -> None:
    from cic.store.landing import landing_arrow_schema

    schema = landing_arrow_schema()
    wrong = schema.set(schema.get_field_index("value"), pa.field("value", pa.string()))
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), wrong.empty_table(), mode="append")
    with pytest.raises(UserError, match="column 'value' is string"):
        landed_table(tmp_path / "t")


def test_a_batch_landed_where_the_flow_cannot_see_it_is_refused_not_lost(tmp_path: Path) -> None:
    """A landing path that is not shared: the worker committed on its node's disk, the flow's table is older (or
    absent) — the answer stage stops naming the path instead of counting the batch as stored."""
    from cic.services.answer_stage import store_batch

    seen, elsewhere = tmp_path / "here", tmp_path / "another-node"
    land(seen, batch("r", 0, 2))
    for _ in range(3):
        version = land(elsewhere, batch("r", 0, 2))
    with Store.open(tmp_path / "cic.duckdb") as store:
        with pytest.raises(UserError, match="a worker committed version 2 but this process sees version 0"):
            store_batch(store, {"landed": version}, str(seen))
        with pytest.raises(UserError, match="sees no table there; give a path every Ray node shares"):
            store_batch(store, {"landed": 0}, str(tmp_path / "absent"))
        store_batch(store, {"landed": version}, str(elsewhere))  # the same table: loaded
        assert store.count("scores") == 2


def test_compaction_mixes_no_two_attempts_of_a_question(tmp_path: Path) -> None:
    """Both attempts of a retried batch in one compacted file: a fresh store and one that loaded them before both end
    with the later attempt's generation, score and label together — never a generation of one and a score of the
    other."""
    from deltalake import DeltaTable

    table = tmp_path / "landing"
    first, second = batch("r", 0, 3, value=0.1), batch("r", 0, 3, value=0.9)
    second["generations"] = second["generations"].with_columns(pl.lit("second attempt").alias("text"))
    second["labels"] = second["labels"].with_columns(pl.col("aligned").not_())
    land(table, first)
    time.sleep(0.01)
    land(table, second)
    with Store.open(tmp_path / "before.duckdb") as store:
        load_landing(store, table)
    DeltaTable(str(table)).optimize.compact()  # one new file holding both attempts, added by an OPTIMIZE commit
    for name in ("before", "fresh"):
        with Store.open(tmp_path / f"{name}.duckdb") as store:
            again = load_landing(store, table)
            assert again.files == 1  # the compacted file: its rows are the same facts
            assert store.read("scores").get_column("value").to_list() == [0.9] * 3, name
            assert store.read("generations").get_column("text").to_list() == ["second attempt"] * 3, name
            assert store.read("labels").get_column("aligned").to_list() == [False, True, False], name


def test_a_landing_table_made_before_a_column_was_added_gains_it_and_its_older_rows_read_as_null(
        tmp_path: Path) -> None:
    """A table landed before `generations.hidden` existed loads, and the next batch that has the column adds it in
    its commit; the older rows read as null. A table lacking a column that was always there stays refused."""
    from deltalake import write_deltalake

    from cic.store.landing import landing_batch

    table, db = tmp_path / "landing", tmp_path / "cic.duckdb"
    write_deltalake(str(table), landing_batch(batch("r", 0, 2)).drop_columns(["hidden"]), mode="append")
    with Store.open(db) as store:
        load_landing(store, table)
    newer = batch("r", 2, 2)
    newer["generations"] = newer["generations"].with_columns(hidden=pl.Series([b"\x01\x02", None]))
    assert land(table, newer) == 1
    with Store.open(db) as store:
        load_landing(store, table)
        hidden = dict(store.read("generations").select("question_id", "hidden").iter_rows())
    assert hidden == {"0": None, "1": None, "2": b"\x01\x02", "3": None}
    older = tmp_path / "older"
    write_deltalake(str(older), landing_batch(batch("r", 0, 2)).drop_columns(["hidden", "text"]), mode="append")
    with pytest.raises(UserError, match="holds another layout"):
        land(older, batch("r", 2, 2))
