"""Calibrate and evaluate every (run, estimator, criterion) group of some runs and store it: the pipeline's
calibrate task and `cic log TABLE` both call `calibrate_store`."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from cic import schema
from cic.pipeline.config import CalibrationConfig
from cic.pipeline.gates.lifecycle import promote_first_gates
from cic.pipeline.gates.system_gates import calibrate_systems
from cic.pipeline.run import progress
from cic.pipeline.run.run_results import CalibrateStats
from cic.pipeline.run.stored_calibration import (
    GroupKey,
    calibration_rows,
    evaluation_rows,
    group_counts,
    group_evaluation_rows,
    groups_of_run,
    iter_group_pairs,
    pair_columns,
    span,
)
from cic.store import Store


def calibrate_store(db: str, run_keys: Sequence[str], calibration: CalibrationConfig,
                   estimators: Sequence[str] | None = None, criteria: Sequence[str] | None = None) -> CalibrateStats:
    """Gate per (alpha, bound, search) on each group's pairs plus the split protocol; idempotent upserts. A gate
    whose key has no live gate yet goes live; later ones wait as candidates (`cic gate promote`)."""
    stats = CalibrateStats()
    with Store.open(db, wait_s=60) as store:
        runs = [r for r in store.read("runs").iter_rows(named=True) if r["run_key"] in set(run_keys)]
        groups = [g for run in runs for g in groups_of_run(store, run, estimators, criteria, calibration.judged)]
        together = group_counts(runs, calibration)  # G per model with `group_by: dataset`, else 1
        by_family: dict[tuple[str, str, str], list[tuple[GroupKey, pl.DataFrame]]] = {}
        for key, timed in iter_group_pairs(store, groups, calibration.label_policy):
            pairs = timed.select(pair_columns(timed))
            judged = schema.judged_parts(key.criterion) is not None  # no split protocol on judge-plus-people pairs
            if calibration.group_by == "dataset" and not judged:
                by_family.setdefault((key.model, key.estimator, key.criterion), []).append((key, pairs))
            # the window the gates cover (when production saw / labels came): recalibration starts after it
            calibrations = calibration_rows(key, pairs, calibration, window=span(timed), groups=together[key.model])
            evaluations = evaluation_rows(key, pairs, calibration) if not judged else None
            with store.transaction():
                store.upsert("calibrations", calibrations)
                if evaluations is not None:
                    store.upsert("evaluations", evaluations)
                made = promote_first_gates(store, calibrations.get_column("calibration_id"),
                                           reason="pipeline: the first gate of its key")
            stats.promoted += len(made)
            stats.groups += 1
            stats.calibrations += calibrations.height
            stats.evaluations += evaluations.height if evaluations is not None else 0
            stats.unattainable += calibrations.get_column("threshold").null_count()
            progress.report("calibrate", stats.groups, len(groups))
        for parts in by_family.values():
            if len(parts) >= 2:  # the per-dataset table: per-dataset gates beside the pooled gate
                rows = group_evaluation_rows(parts, calibration)
                with store.transaction():
                    store.upsert("group_evaluations", rows)
                stats.group_studies += 1
        calibrate_systems(store, list(run_keys), calibration, stats,  # cascades and estimators chosen, if any
                          promote_first=promote_first_gates)
    return stats
