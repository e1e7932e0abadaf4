"""lm-evaluation-harness `--log_samples` output (`samples_<task>_<time>.jsonl`, one record per document and filter):
multiple-choice tasks become (question, score, error) rows. Each option's log-likelihood (written as a string) is
read from `filtered_resps`, the options' probabilities are their softmax, and CIC's option estimators score them
(`one_minus_max_prob`, `option_entropy`); each per-document metric the record carries (`acc`, `acc_norm`) is a
criterion, error = 1 − its value. The model and harness version come from the `results_*.json` lm-eval writes
beside the samples."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.errors import UserError

if TYPE_CHECKING:
    import polars as pl

ESTIMATORS = ("one_minus_max_prob", "option_entropy")
_SAMPLES = re.compile(r"^samples_(?P<task>.+)_\d{4}-\d{2}-\d{2}T[\d\-.]+\.jsonl$")


def looks_like(record: dict[str, Any]) -> bool:
    return {"doc_id", "resps", "filtered_resps", "arguments"} <= set(record)


def read(path: Path) -> pl.DataFrame:
    import polars as pl

    files = sorted(path.glob("**/samples_*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"file = {str(path)!r}: holds no lm-eval samples_*.jsonl file")
    frames = [_read_file(f) for f in files]
    return pl.concat(frames)


def _read_file(path: Path) -> pl.DataFrame:
    import polars as pl

    match = _SAMPLES.match(path.name)
    task = match.group("task") if match else path.stem
    model, version = _provenance(path)
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.open("rb"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise UserError(f"file = {str(path)!r}: line {number} is not JSON") from None
        rows.extend(_rows(record, path, number, model, task, f"lm-eval {version}"))
    if not rows:
        raise UserError(f"file = {str(path)!r}: no multiple-choice record with a per-document metric")
    return pl.DataFrame(rows, schema={"model": pl.String, "dataset": pl.String, "estimator": pl.String,
                                      "criterion": pl.String, "score": pl.Float64, "error": pl.Int8,
                                      "question_id": pl.String, "source": pl.String})


def _rows(record: dict[str, Any], path: Path, number: int, model: str, task: str,
          source: str) -> list[dict[str, Any]]:
    from cic.llm.uncertainty.estimators import ESTIMATORS as REGISTRY
    from cic.llm.uncertainty.statistics import QuestionStats

    where = f"file = {str(path)!r}, line {number}"
    options = record.get("filtered_resps")
    if not isinstance(options, list) or not options or not all(_is_loglikelihood(o) for o in options):
        raise UserError(f"{where}: not a multiple-choice record (filtered_resps = {str(options)[:80]}); CIC reads "
                        "lm-eval's loglikelihood (multiple_choice) tasks")
    ll = np.array([float(o[0]) for o in options])  # lm-eval writes them as strings
    probs = np.exp(ll - ll.max())
    probs /= probs.sum()
    stats = QuestionStats(str(record["doc_id"]), [], np.zeros(0), np.zeros(0), probs, None)
    scores = {name: REGISTRY.lookup(name).compute(stats) for name in ESTIMATORS}
    filtered = record.get("filter", "none")
    out = []
    for metric in record.get("metrics") or []:
        value = record.get(metric)
        if not isinstance(value, int | float) or value not in (0, 1, 0.0, 1.0) or math.isnan(value):
            raise UserError(f"{where}: metric {metric!r} = {value!r} is not 0 or 1 for one document")
        criterion = metric if filtered in (None, "none") else f"{metric}[{filtered}]"
        out.extend({"model": model, "dataset": task, "estimator": name, "criterion": criterion, "score": score,
                    "error": 1 - int(value), "question_id": str(record["doc_id"]), "source": source}
                   for name, score in scores.items())
    return out


def _is_loglikelihood(option: Any) -> bool:
    if not (isinstance(option, list) and len(option) == 2):
        return False
    try:
        return math.isfinite(float(option[0]))
    except (TypeError, ValueError):
        return False


def _provenance(samples: Path) -> tuple[str, str]:
    """(model, lm-eval version) from the newest results_*.json beside the samples; the folder's name and
    "unknown version" where there is none."""
    results = sorted(samples.parent.glob("results_*.json"))
    model, version = samples.parent.name, "unknown version"
    if results:
        try:
            data = json.loads(results[-1].read_text())
        except (OSError, ValueError):
            return model, version
        version = str(data.get("lm_eval_version") or version)
        named = data.get("model_name") or (data.get("config") or {}).get("model_args")
        if isinstance(named, str) and named:
            model = Path(named.split(",")[0].removeprefix("pretrained=")).name
    return model, version
