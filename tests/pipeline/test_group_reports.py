"""Each stored group's report: the same files whether rendered here or in worker processes (many groups)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from cic.pipeline import group_reports
from cic.pipeline.calibrate_store import calibrate_store
from cic.pipeline.config import CalibrationConfig
from cic.store import Store
from tests.support.pipeline_data import store_run


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


def test_a_bad_worker_count_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from cic.errors import UserError

    monkeypatch.setenv("CIC_REPORT_WORKERS", "zero")
    with pytest.raises(UserError, match="CIC_REPORT_WORKERS = 'zero': expected an integer >= 1"):
        group_reports.report_workers()
    monkeypatch.setenv("CIC_REPORT_WORKERS", "1")
    assert group_reports.report_workers() == 1
