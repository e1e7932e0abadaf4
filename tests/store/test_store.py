"""The DuckDB store: round trips for every table, idempotent upserts, resume, migration, injection, locks,
foreign files, calibration pairs and Parquet export/import."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import cic
from cic import schema
from cic.data import load_questions
from cic.errors import UserError
from cic.store.database import (
    SCHEMA_VERSION,
    NotADuckDBFileError,
    Store,
    StoreError,
    StoreLockedError,
    create_table_sql,
    duckdb_type,
)
from tests.support.database import raw_sql

ROOT = Path(__file__).resolve().parents[2]
INJECTION = "x'); DROP TABLE scores; --"
OLD_SCORES_TABLE = "CREATE TABLE scores (run_key VARCHAR, question_id VARCHAR, estimator VARCHAR, value DOUBLE)"


def example_rows(spec: schema.TableSpec, n: int, seed: int = 0) -> pl.DataFrame:
    """n rows of any table with distinct keys and values of every kind (nulls, empty and non-empty lists)."""
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {}
    for name, dtype in spec.columns.items():
        if name in spec.key:
            values = [f"{name}-{i}" if dtype == pl.String else (i if dtype != pl.Float64 else i / 10)
                      for i in range(n)]
        elif dtype == pl.String:
            values = [f"{name} {i} ünïcode '\"; --" if i % 5 else None for i in range(n)]
        elif dtype in (pl.Int32, pl.Int64):
            values = [int(v) for v in rng.integers(0, 1000, n)]
        elif dtype == pl.Float64:
            values = [float(v) if i % 7 else None for i, v in enumerate(rng.normal(size=n))]
        elif dtype == pl.Boolean:
            values = [bool(v) for v in rng.integers(0, 2, n)]
        elif isinstance(dtype, pl.List):
            inner = dtype.inner
            values = [None if i % 4 == 0 else [] if i % 4 == 1 else
                      ([f"f{i}", "g"] if inner == pl.String else [0.25, float(i)]) for i in range(n)]
        elif isinstance(dtype, pl.Datetime):
            values = [datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(n)]
        elif dtype == pl.Binary:
            values = [None if i % 3 == 0 else bytes([i % 256, 0, 255]) * (i % 5) for i in range(n)]
        else:
            raise AssertionError(f"no example values for {dtype}")
        columns[name] = values
    return pl.DataFrame(columns, schema=spec.schema)


def scores_frame(run_key: str, question_ids: list[str], estimator: str = "se", offset: float = 0.0) -> pl.DataFrame:
    return pl.DataFrame({"run_key": run_key, "question_id": question_ids, "estimator": estimator,
                         "value": [offset + i / 10 for i in range(len(question_ids))]})


def labels_frame(run_key: str, question_ids: list[str], aligned: list[bool], criterion: str = "match"):
    return pl.DataFrame({"run_key": run_key, "question_id": question_ids, "criterion": criterion,
                         "aligned": aligned, "value": [float(a) for a in aligned]})


def generations_frame(run_key: str, question_ids: list[str], samples: int) -> pl.DataFrame:
    rows = [{"run_key": run_key, "question_id": q, "sample_index": s, "text": f"answer {q}/{s}", "n_tokens": 3,
             "logprob_sum": -1.5, "logprob_mean": -0.5, "is_greedy": s == 0, "option_probs": None, "flags": []}
            for q in question_ids for s in range(samples)]
    return pl.DataFrame(rows, schema=schema.GENERATIONS.schema)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cic.duckdb"


# ----------------------------------------------------------------------------------------------------------
# Layout, round trips, idempotency


def test_tables_are_created_from_the_shared_specs(db: Path) -> None:
    with Store.open(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.counts() == {name: 0 for name in schema.TABLES}
    con = duckdb.connect(str(db), read_only=True)
    try:
        for spec in schema.TABLES.values():
            stored = con.sql("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
                             "ORDER BY ordinal_position", params=[spec.name]).fetchall()
            assert [c for c, _ in stored] == list(spec.columns)
            keys = con.sql("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = ? AND "
                           "constraint_type = 'PRIMARY KEY'", params=[spec.name]).fetchall()
            assert [tuple(k) for (k,) in keys] == [spec.key]
        assert con.sql("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    finally:
        con.close()
    assert duckdb_type(pl.List(pl.Float64())) == "DOUBLE[]"
    assert duckdb_type(pl.Datetime("us", "UTC")) == "TIMESTAMPTZ"
    assert "PRIMARY KEY (run_key, question_id, sample_index)" in create_table_sql(schema.GENERATIONS)


@pytest.mark.parametrize("table", list(schema.TABLES))
def test_round_trip_and_idempotent_rewrite_for_every_table(db: Path, table: str) -> None:
    spec = schema.TABLES[table]
    rows = example_rows(spec, 40)
    with Store.open(db) as store:
        assert store.upsert(table, rows) == 40
        first = store.read(table)
        assert first.equals(rows.sort(list(spec.key)))
        store.upsert(table, rows.reverse())  # the same rows again, in another order
        assert store.count(table) == 40
        assert store.read(table).equals(first)
    with Store.open(db, read_only=True) as store:  # persisted
        assert store.read(table).equals(first)


def test_upsert_replaces_values_but_keeps_created_at(db: Path) -> None:
    with Store.open(db) as store:
        key = store.register_run("m", "d", "validation", "p", {"k": 1})
        created = store.read("runs")["created_at"][0]
        time.sleep(0.01)
        assert store.register_run("m", "d", "validation", "p", {"k": 1}) == key
        assert store.read("runs")["created_at"].to_list() == [created]
        store.upsert("scores", scores_frame(key, ["a", "b"]))
        store.upsert("scores", scores_frame(key, ["b"], offset=5.0))
        assert store.read("scores")["value"].to_list() == [0.0, 5.0]


def test_a_batch_is_deduplicated_on_its_key_last_row_wins(db: Path) -> None:
    batch = pl.concat([scores_frame("r", ["a", "b"]), scores_frame("r", ["a"], offset=9.0)])
    with Store.open(db) as store:
        assert store.upsert("scores", batch) == 2
        assert store.read("scores")["value"].to_list() == [9.0, 0.1]


def test_worker_batches_polars_and_arrow_in_one_transaction(db: Path) -> None:
    batches = [scores_frame("r", [f"q{i}" for i in range(0, 50)]),
               scores_frame("r", [f"q{i}" for i in range(50, 100)]).to_arrow(),
               scores_frame("r", ["q0"], offset=7.0)]  # a retried task re-sends q0: its last row wins
    with Store.open(db) as store:
        assert store.upsert_batches("scores", batches) == 100
        assert store.count("scores", run_key="r") == 100
        assert store.read("scores", question_id="q0")["value"].to_list() == [7.0]
        assert store.upsert_batches("scores", []) == 0


# ----------------------------------------------------------------------------------------------------------
# Bad batches change nothing


def test_bad_batches_raise_clear_errors_and_write_nothing(db: Path) -> None:
    with Store.open(db) as store:
        store.upsert("scores", scores_frame("r", ["a", "b"]))
        before = store.read("scores")
        bad_key = scores_frame("r", ["c", "d"]).with_columns(
            pl.when(pl.col("question_id") == "d").then(None).otherwise(pl.col("question_id")).alias("question_id"))
        with pytest.raises(UserError, match=r"scores.question_id is null at row 1"):
            store.upsert_batches("scores", [scores_frame("r", ["e"]), bad_key])
        with pytest.raises(UserError, match=r"scores.value: cannot store"):
            store.upsert("scores", scores_frame("r", ["f"]).with_columns(pl.lit("high").alias("value")))
        with pytest.raises(UserError, match="lack column\\(s\\) estimator"):
            store.upsert("scores", scores_frame("r", ["g"]).drop("estimator"))
        with pytest.raises(UserError, match="table = 'score': unknown"):
            store.upsert("score", scores_frame("r", ["h"]))
        with pytest.raises(RuntimeError, match="worker failed"), store.transaction():
            store.upsert("scores", scores_frame("r", ["x", "y"]))
            store.upsert("labels", labels_frame("r", ["x"], [True]))
            raise RuntimeError("worker failed")
        assert store.read("scores").equals(before)
        assert store.count("labels") == 0


def test_read_only_store_refuses_writes(db: Path) -> None:
    Store.open(db).close()
    with Store.open(db, read_only=True) as store, pytest.raises(StoreError, match="opened read-only"):
        store.upsert("scores", scores_frame("r", ["a"]))


# ----------------------------------------------------------------------------------------------------------
# Resume


def test_resume_writes_each_key_exactly_once(db: Path) -> None:
    questions = load_questions("trivia_qa", limit=40)
    ids = questions["question_id"].to_list()
    with Store.open(db) as store:
        store.upsert("questions", questions)
        run = store.register_run("pkg:model", "trivia_qa", "validation", "short-answer-v1", {"k": 3})
        store.upsert("generations", generations_frame(run, ids[:20], samples=4))
        store.upsert("generations", generations_frame(run, ids[20:25], samples=2))  # crashed mid-question
    with Store.open(db) as store:  # a new process after the crash
        todo = store.missing_questions(run, ids, min_rows=4)
        assert todo == ids[20:]
        assert store.missing_questions(run, ids, min_rows=1) == ids[25:]
        store.upsert("generations", generations_frame(run, todo, samples=4))
        assert store.missing_questions(run, ids, min_rows=4) == []
        stored = store.read("generations", run_key=run)
        assert stored.height == 40 * 4
        assert stored.select(schema.GENERATIONS.key).is_unique().all()
        store.upsert("scores", scores_frame(run, ids[:10], estimator="se"))
        assert store.missing_questions(run, ids[:12], table="scores", estimator="se") == ids[10:12]
        assert store.missing_questions(run, ids[:12], table="scores", estimator="other") == ids[:12]
        with pytest.raises(ValueError, match="min_rows = 0"):
            store.missing_questions(run, ids, min_rows=0)


# ----------------------------------------------------------------------------------------------------------
# Migration


def test_migration_from_an_unversioned_older_file(db: Path) -> None:
    """Version 0: tables made by hand (no keys, a duplicate row, generations without the newer columns)."""
    raw_sql(db, OLD_SCORES_TABLE,
            "INSERT INTO scores VALUES ('r', 'a', 'se', 0.5), ('r', 'a', 'se', 0.5), ('r', 'b', 'se', 1.5)",
            "CREATE TABLE generations (run_key VARCHAR, question_id VARCHAR, sample_index INTEGER, text VARCHAR,"
            " n_tokens INTEGER, logprob_sum DOUBLE, logprob_mean DOUBLE, is_greedy BOOLEAN)",
            "INSERT INTO generations VALUES ('r', 'a', 0, 'Paris', 1, -0.1, -0.1, true)")
    with Store.open(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.read("scores").rows() == [("r", "a", "se", 0.5), ("r", "b", "se", 1.5)]
        gen = store.read("generations").row(0, named=True)
        assert gen["text"] == "Paris" and gen["option_probs"] is None and gen["flags"] is None
        store.upsert("scores", scores_frame("r", ["a"], offset=2.0))  # the key now exists: upsert works
        assert store.read("scores")["value"].to_list() == [2.0, 1.5]
        assert store.count("calibrations") == 0  # missing tables were created
    with Store.open(db, read_only=True) as store:
        assert store.schema_version == SCHEMA_VERSION


def test_version_3_keys_runs_by_generation_settings_and_keeps_every_stored_key(db: Path) -> None:
    """A version-2 run recorded its estimators in generation_config; after migrating, the same generation
    settings with other estimators find that run (its key, rows and gate ids unchanged)."""
    with Store.open(db) as store:
        old = store.register_run("m", "d", "validation", "p", {"model_spec": "x", "temperature": 1.0,
                                                               "estimators": ["eigv"], "equivalence": "embedding"})
        store.upsert("scores", scores_frame(old, ["a", "b"]))
    raw_sql(db, "DELETE FROM schema_version", "INSERT INTO schema_version VALUES (2, now())")
    with Store.open(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.read("runs")["generation_config"][0] == '{"model_spec":"x","temperature":1.0}'
        assert store.register_run("m", "d", "validation", "p", {"model_spec": "x", "temperature": 1.0}) == old
        assert store.count("runs") == 1 and store.count("scores", run_key=old) == 2
        other = store.register_run("m", "d", "validation", "p", {"model_spec": "x", "temperature": 0.7})
        assert other != old and store.count("runs") == 2  # what shapes generations still makes a new run


def test_a_column_whose_type_changed_needs_a_migration(db: Path) -> None:
    Store.open(db).close()
    raw_sql(db, "ALTER TABLE scores ALTER value TYPE VARCHAR")
    for read_only in (False, True):
        with pytest.raises(StoreError, match="scores.value is VARCHAR in the file but DOUBLE in cic.schema"):
            Store.open(db, read_only=read_only)


@pytest.mark.parametrize("table", ["labels", "gate_events", "schema_version"])
def test_a_crafted_file_with_a_view_in_place_of_a_table_is_refused(db: Path, table: str) -> None:
    """A view named like a cic table (here one that makes every label correct) is refused on open, read-only or
    not, naming the table; nothing of the file is changed."""
    Store.open(db).close()
    raw_sql(db, f"CREATE TABLE stash AS SELECT * FROM {table}; DROP TABLE {table}; "
                f"CREATE VIEW {table} AS SELECT * FROM stash")
    for read_only in (True, False):
        with pytest.raises(StoreError, match=f"{table} is a view, not a table; this file was not written by cic"):
            Store.open(db, read_only=read_only)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.sql(f"SELECT table_type FROM information_schema.tables WHERE table_name = '{table}'").fetchall() \
            == [("VIEW",)]
    finally:
        con.close()


def test_a_column_added_to_the_schema_is_added_on_open(db: Path) -> None:
    with Store.open(db) as store:
        store.upsert("labels", labels_frame("r", ["a"], [True]))
    raw_sql(db, "ALTER TABLE labels DROP COLUMN value")  # a file written before `value` existed
    with pytest.raises(StoreError, match="older layout"):
        Store.open(db, read_only=True)
    with Store.open(db) as store:
        assert store.read("labels").row(0, named=True)["value"] is None


def test_newer_files_and_bad_migrations_leave_the_file_alone(db: Path) -> None:
    Store.open(db).close()
    raw_sql(db, "INSERT INTO schema_version VALUES (?, now())", params=[SCHEMA_VERSION + 1])
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this cic"):
        Store.open(db)
    other = db.with_name("old.duckdb")
    raw_sql(other, OLD_SCORES_TABLE, "INSERT INTO scores VALUES (NULL, 'a', 'se', 0.5)")
    with pytest.raises(StoreError, match="1 row\\(s\\) with a null 'run_key'"):
        Store.open(other)
    raw_sql(other, "UPDATE scores SET run_key = 'r'", "ALTER TABLE scores ADD COLUMN notes VARCHAR")
    with pytest.raises(StoreError, match="has column\\(s\\) notes that cic.schema does not know"):
        Store.open(other)
    con = duckdb.connect(str(other), read_only=True)
    tables = {t for (t,) in con.sql("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    assert tables == {"scores"}  # the failed migration rolled back completely


# ----------------------------------------------------------------------------------------------------------
# Injection, foreign files, locks


def test_sql_injection_text_is_stored_as_data(db: Path) -> None:
    with Store.open(db) as store:
        run = store.register_run(INJECTION, INJECTION, "validation", INJECTION, {"note": INJECTION})
        store.upsert("scores", scores_frame(run, [INJECTION, "b"], estimator=INJECTION))
        store.upsert("labels", labels_frame(run, [INJECTION, "b"], [True, False], criterion=INJECTION))
        assert store.read("runs", model=INJECTION)["dataset"].to_list() == [INJECTION]
        assert store.read("scores", question_id=[INJECTION])["estimator"].to_list() == [INJECTION]
        pairs = store.calibration_frame(INJECTION, INJECTION, INJECTION, INJECTION)
        assert pairs["question_id"].to_list() == ["b", INJECTION] and pairs["error"].to_list() == [1, 0]
        assert store.missing_questions(run, [INJECTION, "c"], table="scores") == ["c"]
        with pytest.raises(UserError, match="scores has no column"):
            store.read("scores", **{"value; DROP TABLE scores": 1})
        assert store.count("scores") == 2


@pytest.mark.parametrize("content,kind", [(b"just some text\n" * 5, "some other kind of file"), (b"", "an empty file"),
                                          (b"PAR1" + b"\0" * 60, "a Parquet file")])
def test_a_file_that_is_not_duckdb_is_refused_untouched(db: Path, content: bytes, kind: str) -> None:
    db.write_bytes(content)
    with pytest.raises(NotADuckDBFileError, match=f"is not a DuckDB database \\(it is {kind}\\); nothing was "
                                                  "changed"):
        Store.open(db)
    assert db.read_bytes() == content


def test_a_sqlite_file_is_refused_without_touching_the_network(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "results.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(NotADuckDBFileError, match="it is a SQLite database"):
        Store.open(path)


@pytest.mark.faults
def test_a_store_locked_by_another_process_says_so(db: Path) -> None:
    Store.open(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[2]); from cic.store import Store; "
         "s = Store.open(sys.argv[1]); print('open', flush=True); time.sleep(60)", str(db), str(ROOT)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        for read_only in (False, True):
            with pytest.raises(StoreLockedError, match=f"is locked by process {holder.pid}: DuckDB lets one "
                                                       "process open a database for writing"):
                Store.open(db, read_only=read_only)
    finally:
        holder.kill()
        holder.wait()
    Store.open(db).close()  # free again once the holder is gone


@pytest.mark.slow
@pytest.mark.faults
def test_a_writer_waits_for_a_reader_holding_the_file_instead_of_failing(db: Path) -> None:
    """A read-only connection held by another process (cic ask, a notebook) makes a batch write wait."""
    with Store.open(db) as store:
        store.upsert("questions", load_questions("trivia_qa", limit=5))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[2]); from cic.store import Store; "
         "s = Store.open(sys.argv[1], read_only=True); print('open', flush=True); time.sleep(3); s.close()",
         str(db), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        started = time.perf_counter()
        with pytest.raises(StoreLockedError):
            Store.open(db, wait_s=0.5)  # a bounded wait that is too short still says why
        with Store.open(db, wait_s=60) as store:  # long enough: it gets the file once the reader closes
            store.upsert("questions", load_questions("commonsense_qa", limit=5))
        assert 2.0 < time.perf_counter() - started < 30
    finally:
        holder.kill()
        holder.wait()
    with Store.open(db, read_only=True) as store:
        assert store.count("questions") == 10


def test_opening_errors_for_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist, so there is nothing to read"):
        Store.open(tmp_path / "none.duckdb", read_only=True)
    with pytest.raises(StoreError, match="directory .* does not exist"):
        Store.open(tmp_path / "no" / "such" / "x.duckdb")
    with pytest.raises(NotADuckDBFileError, match="is a directory"):
        Store.open(tmp_path)
    with Store.open(tmp_path / "x.duckdb"), pytest.raises(StoreError, match="already open read-write in this "
                                                                          "process; use that Store"):
        Store.open(tmp_path / "x.duckdb", read_only=True)


# ----------------------------------------------------------------------------------------------------------
# Calibration pairs


def test_calibration_frame_feeds_calibrate_and_refuses_to_mix_runs(db: Path) -> None:
    rng = np.random.default_rng(3)
    ids = [f"q{i:04d}" for i in range(400)]
    scores = rng.random(400)
    errors = rng.random(400) < 0.5 * scores
    with Store.open(db) as store:
        run = store.register_run("m", "trivia_qa", "validation", "short-answer-v1", {"temperature": 1.0})
        store.upsert("scores", pl.DataFrame({"run_key": run, "question_id": ids, "estimator": "se",
                                             "value": scores}))
        store.upsert("labels", labels_frame(run, ids, list(~errors), criterion="similarity[0.6]"))
        pairs = store.calibration_frame("m", "trivia_qa", "se", "similarity[0.6]")
        assert pairs.columns == ["question_id", "score", "error"] and pairs.height == 400
        np.testing.assert_array_equal(pairs["score"].to_numpy(), scores)
        np.testing.assert_array_equal(pairs["error"].to_numpy(), errors.astype(np.int8))
        result = cic.calibrate(pairs["score"].to_numpy(), pairs["error"].to_numpy(), alpha=0.2)
        assert result == cic.calibrate(scores, errors.astype(int), alpha=0.2)

        other = store.register_run("m", "trivia_qa", "validation", "short-answer-v1", {"temperature": 0.5})
        with pytest.raises(UserError, match=f"2 runs match .*pass run_key= to choose one: .*run_key=({run}|{other})"):
            store.calibration_frame("m", "trivia_qa", "se", "similarity[0.6]")
        assert store.calibration_frame("m", "trivia_qa", "se", "similarity[0.6]", run_key=run).equals(pairs)
        with pytest.raises(UserError, match="no run with model='m', dataset='commonsense_qa'"):
            store.calibration_frame("m", "commonsense_qa", "se", "similarity[0.6]")
        with pytest.raises(UserError, match=r"no scores for estimator=.lexical.; stored estimator values: \[.se.\]"):
            store.calibration_frame("m", "trivia_qa", "lexical", "similarity[0.6]", run_key=run)


def test_calibration_frame_reports_unlabelled_questions(db: Path) -> None:
    with Store.open(db) as store:
        run = store.register_run("m", "d", "validation", "p", {})
        store.upsert("scores", scores_frame(run, ["a", "b", "c"]))
        store.upsert("labels", labels_frame(run, ["a", "b"], [True, False]))
        with pytest.raises(UserError, match=r"1 question\(s\) have a 'se' score but no 'match' label .*\['c'\]"):
            store.calibration_frame("m", "d", "se", "match")
        partial = store.calibration_frame("m", "d", "se", "match", allow_partial=True)
        assert partial.rows() == [("a", 0.0, 0), ("b", 0.1, 1)]


# ----------------------------------------------------------------------------------------------------------
# Export / import


def test_export_and_import_move_a_table_between_stores(tmp_path: Path) -> None:
    rows = example_rows(schema.GENERATIONS, 30)
    out = tmp_path / "generations.parquet"
    with Store.open(tmp_path / "a.duckdb") as source:
        source.upsert("generations", rows)
        assert source.export("generations", out) == 30
        assert source.export("generations", tmp_path / "one.parquet", question_id="question_id-3") == 1
    with Store.open(tmp_path / "b.duckdb") as target:
        assert target.import_(out) == ("generations", 30)
        assert target.import_(out) == ("generations", 30)  # idempotent
        assert target.read("generations").equals(rows.sort(list(schema.GENERATIONS.key)))
        with pytest.raises(UserError, match="holds table 'generations', not 'scores'"):
            target.import_(out, table="scores")
        plain = tmp_path / "plain.parquet"
        scores_frame("r", ["a"]).drop("estimator").write_parquet(plain)
        with pytest.raises(UserError, match="does not say which table"):
            target.import_(plain)
        with pytest.raises(UserError, match="lack column\\(s\\) estimator"):
            target.import_(plain, table="scores")
        assert target.count("scores") == 0
        with pytest.raises(UserError, match="give a .parquet file name"):
            target.export("scores", tmp_path / "scores.csv")


@pytest.mark.faults
def test_a_file_with_corrupted_blocks_gives_one_clear_error_and_is_not_changed(tmp_path: Path) -> None:
    import hashlib

    db = tmp_path / "c.duckdb"
    with Store.open(db) as store:
        store.upsert("questions", load_questions("trivia_qa", limit=50))
    data = bytearray(db.read_bytes())
    rng = np.random.default_rng(0)
    data[12288:] = rng.integers(0, 256, len(data) - 12288, dtype=np.uint8).tobytes()  # keep the headers
    db.write_bytes(bytes(data))
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for read_only in (True, False):
        with pytest.raises(StoreError, match="is damaged and cannot be read .* It was not changed. Recover"):
            Store.open(db, read_only=read_only)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


@pytest.mark.faults
def test_a_full_disk_gives_a_clear_error_and_keeps_earlier_rows(db: Path) -> None:
    """A size-limited file (RLIMIT_FSIZE) stands in for a full disk: the batch fails whole, the rest stays."""
    with Store.open(db) as store:
        store.upsert("questions", load_questions("trivia_qa", limit=50))
    code = (
        "import os, resource, signal, sys\n"
        "import numpy as np, polars as pl\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "limit = os.path.getsize(sys.argv[1]) + 200_000\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from cic.store import Store, StoreError\n"
        "n = 2_000_000\n"
        "frame = pl.DataFrame({'run_key': 'r', 'question_id': [f'q{i}' for i in range(n)], 'estimator': 'e',\n"
        "                      'value': np.random.default_rng(0).random(n)})\n"
        "try:\n"
        "    with Store.open(sys.argv[1]) as store:\n"
        "        store.upsert('scores', frame)\n"
        "except StoreError as exc:\n"
        "    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(db), str(ROOT)], capture_output=True, text=True,
                          timeout=300)
    assert "writing 2000000 scores rows failed" in proc.stdout and "earlier rows are intact" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]
    with Store.open(db, read_only=True) as store:
        assert store.count("questions") == 50 and store.count("scores") == 0


BLOCK, HEADERS = 262_144, 12_288  # DuckDB's block size and the three header blocks before the first block


def damage_blocks_after_open(db: Path) -> int:
    """Overwrite every data block (never the headers) whose damage still lets the file open, so the damage is
    found by a query, not at open; returns how many blocks were overwritten."""
    damaged = 0
    for start in range(HEADERS, db.stat().st_size, BLOCK):
        before = db.read_bytes()
        data = bytearray(before)
        data[start:start + BLOCK] = b"\xab" * len(data[start:start + BLOCK])
        db.write_bytes(bytes(data))
        try:
            Store.open(db, read_only=True).close()
            damaged += 1
        except StoreError:
            db.write_bytes(before)  # this block holds what open reads: keep it
    return damaged


@pytest.mark.faults
def test_damage_found_by_a_query_after_open_is_one_damaged_store_error(db: Path) -> None:
    import hashlib

    from cic.store.database import DamagedStoreError

    with Store.open(db) as store:
        key = store.register_run("m", "d", "validation", "p", {"k": 1})
        store.upsert("scores", scores_frame(key, [f"q{i}" for i in range(2000)]))
    assert damage_blocks_after_open(db) > 0
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for read_only in (True, False):
        with pytest.raises(DamagedStoreError, match=r"is damaged: a block of it could not be read .*Corrupt database "
                                                    r"file.* Recover: restore the file from a copy.*cic export"):
            with Store.open(db, read_only=read_only) as store:
                store.read("scores")
    with pytest.raises(DamagedStoreError, match="is damaged"):  # a write in a transaction: not "transaction aborted"
        with Store.open(db) as store, store.transaction():
            store.upsert("runs", pl.DataFrame({"run_key": ["r2"], "model": ["m"], "dataset": ["d2"],
                                               "split": ["s"], "prompt_id": ["p"], "generation_config": ["{}"]}))
            store.upsert("scores", scores_frame("r2", ["x"]))
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_errors_that_are_not_damage_keep_their_type(db: Path) -> None:
    with pytest.raises(duckdb.CatalogException), Store.open(db) as store:
        store.sql("SELECT * FROM no_such_table")
    with pytest.raises(KeyError), Store.open(db) as store:
        raise KeyError("a bug stays a bug")


def every_table(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table of a store, opened read-only (what a test compares before and after a fault)."""
    with Store.open(db, read_only=True) as store:
        return {name: store.read(name).rows() for name in schema.TABLES}
