"""Each stored group's report (tables and figures, from the store): what `cic run` writes beside MLflow, and
alone with `--no-mlflow`; the MLflow layout attaches the same directories as artifacts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from cic import schema
from cic.reports.report import ReportConfig, file_slug, write_report
from cic.stats.searches import get_search
from cic.store import Store
from cic.store.outputs import guard_output_dir, write_frame
from cic.store.queries import loggable_units


@dataclass(frozen=True)
class UnitReport:
    """One group's report directory and the stored rows it was rendered from."""

    out: Path
    key: str                    # the group's key: its evaluation and gates (`log_key`)
    run: dict[str, Any]
    calibrations: pl.DataFrame
    evaluations: pl.DataFrame
    pairs: pl.DataFrame
    searches: tuple[str, ...]


def log_units(store: Store, run_keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The loggable units: one per stored evaluation with the pipeline gates of the same data."""
    units = loggable_units(store)
    return [u for u in units if run_keys is None or u["run_key"] in set(run_keys)]


def pipeline_calibrations(store: Store, unit: dict[str, Any]) -> pl.DataFrame:
    """The pipeline's gates of one unit (a recalibration's gates are logged by the recalibrate flow)."""
    calibrations = store.read("calibrations", run_key=unit["run_key"], estimator=unit["estimator"],
                              criterion=unit["criterion"], data_fingerprint=unit["data_fingerprint"])
    return calibrations.filter(pl.col("kind").fill_null("pipeline") == "pipeline")


def log_key(evaluation_id: str, calibrations: pl.DataFrame) -> str:
    """A unit's MLflow idempotency key (`cic.log_key`): its evaluation and the ids of its gates, so a unit is
    logged once and a unit whose gates changed is logged anew."""
    return schema.stable_hash(evaluation_id, *calibrations.get_column("calibration_id").sort().to_list())


def write_unit_report(store: Store, unit: dict[str, Any], report_root: Path) -> UnitReport:
    """Render one group's paper tables and figures from its stored pairs, and its evaluation rows as CSV, under
    `report_root` (a directory named by the group and its key)."""
    run = store.read("runs", run_key=unit["run_key"]).row(0, named=True)
    calibrations = pipeline_calibrations(store, unit)
    evaluations = store.read("evaluations", evaluation_id=unit["evaluation_id"])
    first = evaluations.row(0, named=True)
    pairs = store.calibration_frame(unit["model"], unit["dataset"], unit["estimator"], unit["criterion"],
                                    run_key=unit["run_key"], allow_partial=True)
    key = log_key(unit["evaluation_id"], calibrations)
    out = report_root / file_slug(unit["model"], unit["dataset"], unit["estimator"], unit["criterion"], key[:10])
    frame = pairs.select(pl.lit(unit["model"]).alias("model"), pl.lit(unit["dataset"]).alias("dataset"),
                         pl.lit(unit["estimator"]).alias("estimator"), pl.lit(unit["criterion"]).alias("criterion"),
                         "score", "error")
    searches = tuple(dict.fromkeys(evaluations.get_column("search").to_list()))
    config = ReportConfig(alphas=tuple(sorted(set(evaluations.get_column("alpha").to_list()))),
                          bounds=tuple(dict.fromkeys(evaluations.get_column("bound").to_list())),
                          searches=tuple(s for s in searches if not get_search(s).needs_grid) or ("paper",),
                          delta=first["delta"], n_splits=first["n_splits"], cal_fraction=first["cal_fraction"],
                          seed=first["seed"], sensitivity_fractions=(), baselines=())
    write_report(frame, out, config, stored=evaluations)  # the stored protocol rows: not run again
    write_frame(evaluations, out / "tables" / "evaluations.csv", "--report-dir")
    return UnitReport(out, key, run, calibrations, evaluations, pairs, searches)


def write_group_reports(db: str, report_dir: str, run_keys: Sequence[str] | None = None) -> list[Path]:
    """Every stored group's report under `report_dir` (cic's own directory, never one holding other files)."""
    guard_output_dir(report_dir, "report_dir")
    with Store.open(db, read_only=True, wait_s=60) as store:
        return [write_unit_report(store, unit, Path(report_dir)).out for unit in log_units(store, run_keys)]
