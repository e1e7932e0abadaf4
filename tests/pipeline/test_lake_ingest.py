"""`cic ingest TABLE` on a Delta table (`cic.pipeline.production.lake_ingest`): only what the table gained since the
last ingest, with a file ingest's checks, flags and refusals; resumable after a kill between staging and storing;
bad places, another layout and a recreated table refused in one line with the store unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from cic.cli import app
from cic.errors import UserError
from cic.pipeline.production import lake_ingest
from cic.pipeline.production.ingest import IngestOptions
from cic.pipeline.production.lake_ingest import ingest_table, staging_place
from cic.store import Store
from tests.pipeline.test_ingest import records

pytestmark = pytest.mark.faults


def append(table: Path, frame: pl.DataFrame) -> None:
    write_deltalake(str(table), frame.to_arrow(), mode="append")


def stored(db: Path) -> dict[str, int]:
    with Store.open(db) as store:
        return {k: v for k, v in store.counts().items() if k in ("generations", "scores", "labels", "lake_files")}


def test_each_ingest_reads_only_what_the_table_gained(tmp_path: Path) -> None:
    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    frame = records(9)
    append(table, frame.head(4))
    append(table, frame.slice(4, 3))
    with Store.open(db) as store:
        first = ingest_table(store, table)
        assert (first.version, first.files, [p.records for p in first.parts]) == (1, 2, [7])
        assert ingest_table(store, table).parts == []  # nothing new
        append(table, frame.tail(2))
        later = ingest_table(store, table)
        assert (later.version, later.files, [p.records for p in later.parts]) == (2, 1, [2])
        assert later.parts[0].new == 2 and "version 2" in later.parts[0].file
    assert stored(db)["generations"] == 9 and stored(db)["lake_files"] == 3


def test_a_changed_record_in_a_later_version_is_refused_unless_replace(tmp_path: Path) -> None:
    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    append(table, records(4))
    with Store.open(db) as store:
        ingest_table(store, table)
    before = stored(db)
    append(table, records(4).head(1).with_columns(pl.lit("another answer").alias("answer")))
    with Store.open(db) as store, pytest.raises(UserError, match="replace"):
        ingest_table(store, table)
    assert stored(db) == before  # nothing of it stored, its data file not counted as read
    with Store.open(db) as store:  # the staged part is ingested again, now with --replace
        done = ingest_table(store, table, IngestOptions(replace=True))
    assert [p.replaced for p in done.parts] == [1] and stored(db)["lake_files"] == before["lake_files"] + 1


def test_a_kill_after_staging_is_completed_from_the_staged_part_first(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    append(table, records(6).head(3))
    real = lake_ingest.ingest_file

    def killed(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(lake_ingest, "ingest_file", killed)
    with Store.open(db) as store, pytest.raises(KeyboardInterrupt):
        ingest_table(store, table)
    with Store.open(db) as store:
        place = staging_place(store, f"file://{table}/")
    assert (place / lake_ingest.MANIFEST).exists() and stored(db)["generations"] == 0
    monkeypatch.setattr(lake_ingest, "ingest_file", real)
    append(table, records(6).tail(3))  # the table grew meanwhile
    with Store.open(db) as store:
        done = ingest_table(store, table)
    assert [p.records for p in done.parts] == [3, 3] and not place.exists()
    assert stored(db)["generations"] == 6 and stored(db)["lake_files"] == 2


def test_a_recreated_table_is_refused_and_the_store_is_unchanged(tmp_path: Path) -> None:
    import shutil

    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    for i in range(3):
        append(table, records(9).slice(3 * i, 3))
    with Store.open(db) as store:
        ingest_table(store, table)
    before = stored(db)
    shutil.rmtree(table)
    append(table, records(2))  # version 0 again
    with Store.open(db) as store, pytest.raises(UserError, match="is at version 0, but this store read "
                                                                  "version 2; it was recreated") as info:
        ingest_table(store, table)
    assert "\n" not in str(info.value) and stored(db) == before


def test_a_version_whose_data_file_is_gone_or_a_log_gap_is_refused_in_one_line_and_stores_nothing(
        tmp_path: Path) -> None:
    """A VACUUM (or a retention rule) removed a data file the newest version still names, or a commit file is
    missing from the log: exit 2, one line, the store unchanged; with the file back the same command ingests."""
    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    append(table, records(9).head(4))
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", str(table), "--db", str(db)]).exit_code == 0
    append(table, records(9).slice(4, 3))
    before, newest = stored(db), max(table.glob("*.parquet"), key=lambda f: f.stat().st_mtime_ns)
    newest.rename(tmp_path / "aside.parquet")
    gone = runner.invoke(app, ["ingest", str(table), "--db", str(db)])
    assert gone.exit_code == 2 and len(gone.output.strip().splitlines()) == 1, gone.output
    assert "version 1 names a data file that cannot be read" in gone.output and "VACUUM" in gone.output
    assert stored(db) == before
    (tmp_path / "aside.parquet").write_bytes(b"PAR1 damaged")
    (tmp_path / "aside.parquet").rename(newest)
    damaged = runner.invoke(app, ["ingest", str(table), "--db", str(db)])
    assert damaged.exit_code == 2 and "cannot be read (ArrowInvalid" in damaged.output and stored(db) == before
    append(table, records(9).tail(2))
    (table / "_delta_log" / "00000000000000000001.json").unlink()  # a gap in the log
    gap = runner.invoke(app, ["ingest", str(table), "--db", str(db)])
    assert gap.exit_code == 2 and len(gap.output.strip().splitlines()) == 1 and "cannot be read" in gap.output
    assert stored(db) == before


def test_cic_ingest_of_a_table_says_what_it_read_and_refuses_in_one_line(tmp_path: Path) -> None:
    from cic.store.landing import land
    from tests.store.test_landing import batch

    table, db = tmp_path / "traffic", tmp_path / "s.duckdb"
    append(table, records(5))
    runner = CliRunner()
    ok = runner.invoke(app, ["ingest", str(table), "--db", str(db)])
    assert ok.exit_code == 0 and "(version 0, 1 new data files): 5 record(s) stored, 5 labelled" in \
        " ".join(ok.output.split()), ok.output
    again = runner.invoke(app, ["ingest", str(table), "--db", str(db)])
    assert again.exit_code == 0 and "nothing new since the last ingest" in again.output
    land(tmp_path / "landing", batch("r", 0, 2))  # a CIC landing table: another layout
    for source, words in ((str(tmp_path / "landing"), "lacks column(s) model, stream"),
                          ("ftp://host/t", "not a Delta table URI"), ("s3:///", "not a Delta table URI")):
        bad = runner.invoke(app, ["ingest", source, "--db", str(db)])
        assert bad.exit_code == 2 and words in " ".join(bad.output.split()), bad.output
        assert len(bad.output.strip().splitlines()) == 1
    inside = runner.invoke(app, ["ingest", str(table), "--db", str(table / "_delta_log" / "s.duckdb")])
    assert inside.exit_code == 2 and "lies inside the table" in inside.output
    assert not (table / "_delta_log" / "s.duckdb").exists()
    assert stored(db)["generations"] == 5


def test_the_installed_cic_ingests_a_table_from_a_fresh_directory(tmp_path: Path) -> None:
    table = tmp_path / "traffic"
    append(table, records(3))
    cic = str(Path(sys.executable).with_name("cic"))
    done = subprocess.run([cic, "ingest", str(table)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "3 record(s) stored" in done.stdout, done.stderr
    down = subprocess.run([cic, "ingest", "s3://cic-no-such-bucket/t"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"AWS_EC2_METADATA_DISABLED": "true", "PATH": "/usr/bin"})
    assert down.returncode == 2 and len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert "s3://cic-no-such-bucket/t" in down.stderr and "\\x1b" not in down.stderr and "\x1b" not in down.stderr


@pytest.fixture
def iceberg_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """A SQL catalog (SQLite) named `lake`, configured as a user would: pyiceberg's environment variables."""
    from pyiceberg.catalog.sql import SqlCatalog

    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    for key, value in (("URI", uri), ("WAREHOUSE", warehouse), ("TYPE", "sql")):
        monkeypatch.setenv(f"PYICEBERG_CATALOG__LAKE__{key}", value)
    catalog = SqlCatalog("lake", uri=uri, warehouse=warehouse)
    catalog.create_namespace("prod")
    return catalog


def test_an_iceberg_table_is_read_file_by_file_and_a_recreated_one_refused(tmp_path: Path,
                                                                          iceberg_catalog: object) -> None:
    catalog: object = iceberg_catalog
    frame = records(8).to_arrow()
    table = catalog.create_table("prod.traffic", schema=frame.schema)  # type: ignore[attr-defined]
    table.append(frame.slice(0, 5))
    db, name = tmp_path / "s.duckdb", "iceberg://lake/prod.traffic"
    with Store.open(db) as store:
        first = ingest_table(store, name)
        assert [p.records for p in first.parts] == [5]
        assert first.uri.startswith(name + "#") and first.version == 1
        table.append(frame.slice(5, 3))
        later = ingest_table(store, name)
        assert (later.version, later.files, [p.records for p in later.parts]) == (2, 1, [3])
        assert ingest_table(store, name).parts == []
    table.append(frame.slice(0, 2))
    newest = table.inspect.entries().to_pylist()[0]["data_file"]["file_path"]  # type: ignore[attr-defined]
    Path(newest.removeprefix("file://")).unlink()  # expired by a retention rule, still named by the snapshot
    before = stored(db)
    with Store.open(db) as store, pytest.raises(UserError, match="version 3 names a data file that cannot be read"):
        ingest_table(store, name)
    assert stored(db) == before
    catalog.drop_table("prod.traffic")  # type: ignore[attr-defined]
    catalog.create_table("prod.traffic", schema=frame.schema).append(frame)  # type: ignore[attr-defined]
    with Store.open(db) as store, pytest.raises(UserError, match="another table of that name"):
        ingest_table(store, name)
    assert stored(db) == before
    for bad, words in (("iceberg://lake", "give iceberg://CATALOG/NAMESPACE.TABLE"),
                       ("iceberg://lake/prod.none", "has no table 'prod.none'"),
                       ("iceberg://elsewhere/prod.traffic", "catalog 'elsewhere' cannot be reached")):
        with Store.open(db) as store, pytest.raises(UserError, match=words):
            ingest_table(store, bad)


@pytest.mark.slow
def test_the_installed_cic_ingest_of_a_table_killed_midway_completes_on_the_next_run(tmp_path: Path) -> None:
    """SIGKILL of `cic ingest TABLE` while it stores the staged part; the next run stores it whole, once."""
    import os
    import signal
    import time
    from datetime import UTC, datetime, timedelta

    n = 300_000
    now = datetime.now(UTC)
    frame = pl.DataFrame({"model": "m", "stream": "s", "question_id": [f"q{i}" for i in range(n)], "question": "?",
                          "answer": "a", "timestamp": now - timedelta(days=1), "score:predictive_entropy": 0.5,
                          "correct": True})
    table = tmp_path / "traffic"
    append(table, frame)
    cic = str(Path(sys.executable).with_name("cic"))
    proc = subprocess.Popen([cic, "ingest", str(table), "--db", "s.duckdb"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob(f".cic-lake-*/{lake_ingest.MANIFEST}")):
        time.sleep(0.02)
    time.sleep(0.5)  # inside the ingest of the staged part
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(f".cic-lake-*/{lake_ingest.MANIFEST}"))  # cut off before the part was recorded
    again = subprocess.run([cic, "ingest", str(table), "--db", "s.duckdb"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert stored(tmp_path / "s.duckdb")["generations"] == n and not list(tmp_path.glob(".cic-lake-*"))
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.sql("SELECT count(*) FROM ingests WHERE state <> 'done'")[0][0] == 0
