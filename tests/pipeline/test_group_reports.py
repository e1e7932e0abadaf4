"""Each stored group's report: the same files whether rendered here or in worker processes (many groups)."""

from __future__ import annotations

import filecmp
import time
from pathlib import Path

import psutil
import pytest

from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.calibrate_store import calibrate_store
from cic.pipeline.run import group_reports
from cic.store import Store
from tests.support.pipeline_data import store_run
from tests.support.processes import command_line, still_running


@pytest.mark.slow
def test_many_groups_render_in_worker_processes_to_the_same_files(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, dataset=f"d{i}", n=200, seed=i) for i in range(3)]  # 3 datasets × 2 estimators
    calibrate_store(str(db), keys, CalibrationConfig(alphas=(0.2, 0.3), bounds=("cp",), n_splits=5))
    monkeypatch.setattr(group_reports, "PARALLEL_FROM", 10**6)
    here = group_reports.write_group_reports(str(db), str(tmp_path / "here"))
    monkeypatch.setattr(group_reports, "PARALLEL_FROM", 2)
    monkeypatch.setenv("CIC_REPORT_WORKERS", "2")  # two worker processes on any machine
    spawned = group_reports.write_group_reports(str(db), str(tmp_path / "spawned"))
    assert len(here) == 6 and [p.name for p in spawned] == [p.name for p in here]  # in the store's order
    for directory in here:
        files = sorted(f.relative_to(directory) for f in directory.rglob("*") if f.is_file())
        twin = tmp_path / "spawned" / directory.name
        assert files and files == sorted(f.relative_to(twin) for f in twin.rglob("*") if f.is_file())
        assert any(f.suffix == ".png" for f in files)
        for name in (f for f in files if f.suffix != ".png"):  # tables identical; figures drawn by each process
            assert filecmp.cmp(directory / name, twin / name, shallow=False), name


def _workers(at_least: int = 1) -> set[int]:
    """The pids of this process's report workers (spawned children), once `at_least` of them have started (on a
    loaded machine the pool's second process starts a while after its first)."""
    deadline = time.monotonic() + 60
    found: set[int] = set()
    while time.monotonic() < deadline:
        found = {c.pid for c in psutil.Process().children() if "spawn_main" in command_line(c)}
        if len(found) >= at_least:
            return found
        time.sleep(0.1)
    return found


@pytest.mark.slow
def test_workers_started_ahead_render_the_next_reports_and_none_outlives_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `cic run` does: the workers start as calibration starts; the reports then use those (no second spawn);
    started ahead for too few groups, they are stopped and the reports render here."""
    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        keys = [store_run(store, dataset=f"d{i}", n=200, seed=i) for i in range(3)]
    monkeypatch.setenv("CIC_REPORT_WORKERS", "2")
    group_reports.start_report_workers()
    ahead = _workers(at_least=2)
    calibrate_store(str(db), keys, CalibrationConfig(alphas=(0.2,), bounds=("cp",), n_splits=5))
    monkeypatch.setattr(group_reports, "PARALLEL_FROM", 2)
    seen: set[int] = set()
    for report in group_reports.render_units(_reports(db, tmp_path / "ahead"), 6):
        seen |= _workers()
        assert any(report.out.rglob("*.png"))
    assert ahead and seen == ahead and group_reports._ahead is None  # the same processes, taken once
    assert not _workers_left()
    group_reports.start_report_workers()
    assert _workers()
    monkeypatch.setattr(group_reports, "PARALLEL_FROM", 10**6)  # too few groups: stopped, rendered here
    assert len(list(group_reports.render_units(_reports(db, tmp_path / "here"), 6))) == 6
    assert not _workers_left() and group_reports._ahead is None


def _reports(db: Path, root: Path) -> list[group_reports.UnitReport]:
    with Store.open(db, read_only=True) as store:
        return [group_reports.read_unit(store, unit, root) for unit in group_reports.log_units(store)]


def _workers_left() -> list[psutil.Process]:
    """Report workers still running a few seconds on (a stopped pool's processes exit on their own)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = still_running([c for c in psutil.Process().children() if "spawn_main" in command_line(c)])
        if not left:
            return []
        time.sleep(0.2)
    return left


def test_a_bad_worker_count_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from cic.errors import UserError

    monkeypatch.setenv("CIC_REPORT_WORKERS", "zero")
    with pytest.raises(UserError, match="CIC_REPORT_WORKERS = 'zero': expected an integer >= 1"):
        group_reports.report_workers()
    monkeypatch.setenv("CIC_REPORT_WORKERS", "1")
    assert group_reports.report_workers() == 1


def test_a_groups_report_says_what_its_score_cost_in_generations(tmp_path: Path) -> None:
    """A run whose answers are stored: its group reports end with generations a question (an adaptive run's fewer
    than 11); a run of imported scores, with no answer stored, says nothing of the kind."""
    import polars as pl

    from tests.store.test_queries import rows

    db = tmp_path / "cic.duckdb"
    with Store.open(db) as store:
        key = store_run(store, n=200)
        ids = store.read("labels", run_key=key).get_column("question_id").to_list()
        store.upsert_batches("generations", [rows(key, {q: 5 if i % 2 else 11 for i, q in enumerate(ids)})])
        bare = store_run(store, dataset="other", n=200, seed=1)
    calibrate_store(str(db), [key, bare], CalibrationConfig(alphas=(0.3,), bounds=("cp",), n_splits=5))
    written = group_reports.write_group_reports(str(db), str(tmp_path / "reports"))
    said = {p.name: (p / "README.md").read_text() for p in written}
    costed = [text for name, text in said.items() if name.startswith("m_d_")]
    assert costed and all(f"run {key}): 8.00." in " ".join(t.split()) for t in costed)
    assert not [t for name, t in said.items() if name.startswith("m_other_") and "Generations a question" in t]
    assert pl.Series(list(said)).str.starts_with("m_other_").any()
