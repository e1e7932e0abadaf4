"""The probe stage (`probes.kinds`), between answering and calibrating: fit each run's probes on its kept hidden
states (`cic.llm.probes`) and store them with their scores, so the calibrate stage certifies them like any score.

An accuracy probe per labelled criterion is fitted on the run's fit split (`fit_split`: questions drawn by id hash
before any label is read) and scores only the other questions; the store refuses a certificate that counts one of
its fit questions all the same (`cic.store.queries.refuse_fit_questions`). The semantic-entropy probe is fitted,
label-free, to the run's sampled semantic entropy and scores every question. A probe already stored for the same
questions is not fitted again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl

from cic import schema
from cic.llm.hidden import feature_matrix
from cic.llm.probes import Probe, fit_probe, fit_split, ids_digest
from cic.pipeline.config import ProbesConfig
from cic.store import Store
from cic.store.probe_queries import kept_states, probe_artifact, run_errors, scores_named

ENTROPY_PREFIX = "semantic_entropy"
MIN_FIT = 20


@dataclass
class ProbeStats:
    """What the stage did: probes fitted (estimator names), kept from an earlier run, and runs it skipped (why)."""

    fitted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def fit_run_probes(db: str, run_keys: list[str], config: ProbesConfig, wait_s: float = 60) -> ProbeStats:
    """Fit and store `config.kinds` for every run of `run_keys` that kept hidden states."""
    stats = ProbeStats()
    if not config.kinds:
        return stats
    with Store.open(db, wait_s=wait_s) as store:
        for run in store.read("runs").filter(pl.col("run_key").is_in(run_keys)).iter_rows(named=True):
            layers = json.loads(run["generation_config"]).get("keep_hidden")
            if not layers:
                stats.skipped.append(f"{run['model']} · {run['dataset']}: no hidden states kept")
                continue
            _fit_one_run(store, run, layers, config, stats)
    return stats


def _fit_one_run(store: Store, run: dict[str, Any], layers: list[int], config: ProbesConfig,
                 stats: ProbeStats) -> None:
    key, where = run["run_key"], f"{run['model']} · {run['dataset']}"
    kept = kept_states(store, key)
    ids = kept.get_column("question_id").to_list()
    x = feature_matrix(kept.get_column("hidden").to_list(), len(layers), config.positions)
    common = {"model": run["model"], "layers": tuple(layers), "positions": config.positions}
    if "accuracy" in config.kinds:
        chosen = fit_split(ids, config.fit_share, config.seed)
        labels = run_errors(store, key)
        for criterion in sorted(set(labels.get_column("criterion"))):
            errors = dict(labels.filter(pl.col("criterion") == criterion).select("question_id", "error").iter_rows())
            fit = [q for q in chosen if q in errors]
            name = f"probe_accuracy[{criterion}:{ids_digest(fit)}]"
            if _stored(store, key, name, stats):
                continue
            if len(fit) < MIN_FIT or len({errors[q] for q in fit}) < 2:
                stats.skipped.append(f"{where} · {criterion}: {len(fit)} fit questions, too few or all alike")
                continue
            rows = [ids.index(q) for q in fit]
            probe = fit_probe("accuracy", x[rows], [errors[q] for q in fit], fit, target_name=criterion,
                              seed=config.seed, **common)
            others = [i for i, q in enumerate(ids) if q not in set(fit)]
            _store(store, key, probe, [ids[i] for i in others], probe.score(x[others]), stats)
    if "semantic_entropy" in config.kinds:
        _fit_entropy(store, key, where, ids, x, config, common, stats)


def _fit_entropy(store: Store, key: str, where: str, ids: list[str], x: np.ndarray, config: ProbesConfig,
                 common: dict[str, Any], stats: ProbeStats) -> None:
    scores = scores_named(store, key, ENTROPY_PREFIX)
    if scores.height == 0:
        stats.skipped.append(f"{where}: no semantic entropy stored to fit the entropy probe to")
        return
    target = sorted(set(scores.get_column("estimator")))[0]
    values = dict(scores.filter(pl.col("estimator") == target).select("question_id", "value").iter_rows())
    fit = [q for q in ids if q in values]
    name = f"probe_semantic_entropy[{target}:{ids_digest(fit)}]"
    if _stored(store, key, name, stats):
        return
    rows = [ids.index(q) for q in fit]
    probe = fit_probe("semantic_entropy", x[rows], [values[q] for q in fit], fit, target_name=target,
                      seed=config.seed, **common)
    _store(store, key, probe, ids, probe.score(x), stats)


def _stored(store: Store, key: str, name: str, stats: ProbeStats) -> bool:
    if probe_artifact(store, key, name) is not None:
        stats.kept.append(name)
        return True
    return False


def _store(store: Store, key: str, probe: Probe, ids: list[str], values: np.ndarray, stats: ProbeStats) -> None:
    """The probe and its scores in one transaction."""
    with store.transaction():
        store.upsert("probes", pl.DataFrame({
            "run_key": [key], "estimator": [probe.estimator], "kind": [probe.kind], "target": [probe.target],
            "fit_digest": [probe.fit_digest], "fit_ids": [list(probe.fit_ids)], "artifact": [probe.to_json()],
            "created_at": [datetime.now(UTC)]}, schema=schema.PROBES.schema))
        store.upsert("scores", pl.DataFrame({"run_key": key, "question_id": ids, "estimator": probe.estimator,
                                             "value": values.astype(float)}, schema=schema.SCORES.schema))
    stats.fitted.append(probe.estimator)


def stored_probe(store: Store, run_key: str, estimator: str) -> Probe | None:
    """The probe whose scores are stored under `estimator` in this run (for `cic ask`, exports), or None."""
    artifact = probe_artifact(store, run_key, estimator)
    return None if artifact is None else Probe.from_json(artifact)


def probe_score(db: str, run_key: str, estimator: str, generations: pl.DataFrame) -> float:
    """The stored probe's score of one question from its greedy row's kept states (`cic ask`)."""
    from cic.errors import UserError

    with Store.open(db, read_only=True, wait_s=60) as store:
        probe = stored_probe(store, run_key, estimator)
    if probe is None:
        raise UserError(f"estimator {estimator!r}: the store holds no such probe for run {run_key}")
    blob = generations.filter(pl.col("sample_index") == 0).get_column("hidden")[0]
    if blob is None:
        raise UserError(f"estimator {estimator!r}: this answer kept no hidden states; ask with the config its run "
                        "used (generation.keep_hidden)")
    return float(probe.score(feature_matrix([blob], len(probe.layers), probe.positions))[0])
