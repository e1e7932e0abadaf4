"""lm-evaluation-harness `--log_samples` output (`samples_<task>_<time>.jsonl`, one record per document and filter)
as (question, score, error) rows.

- Multiple choice (`loglikelihood` requests): each option's log-likelihood (written as a string) is read from
  `filtered_resps`, the options' probabilities are their softmax, and CIC's option estimators score them
  (`one_minus_max_prob`, `option_entropy`).
- Generation (`generate_until` with `repeats: K`, K >= 2): the K samples are `resps[0]` (`filtered_resps` holds
  the one answer a filter kept); CIC's sample-based estimators score them (`SAMPLE_ESTIMATORS`, meaning classes
  by MiniLM embeddings as in the pipeline; lm-eval keeps no token log-probabilities, so those estimators are
  left out). A document's samples are scored once whatever the number of filters.

Each per-document metric a record carries (`acc`, `exact_match`) is a criterion — `metric[filter]` when a task has
named filters — and error = 1 − its value. The model and harness version come from the `results_*.json` lm-eval
writes beside the samples."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.store.harness.contract import Once, log_probabilities
from cic.store.harness.samples import OPTION_ESTIMATORS, SAMPLE_ESTIMATORS, option_scores, sample_scores

if TYPE_CHECKING:
    import polars as pl

ESTIMATORS = OPTION_ESTIMATORS

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
    generated: list[tuple[dict[str, Any], int]] = []
    once = Once("document")
    for number, line in enumerate(path.open("rb"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise UserError(f"file = {str(path)!r}: line {number} is not JSON") from None
        if not isinstance(record, dict) or "doc_id" not in record:
            raise UserError(f"file = {str(path)!r}, line {number}: not an lm-eval sample record (no doc_id)")
        once.add((str(record["doc_id"]), str(record.get("filter", "none"))), f"file = {str(path)!r}, line {number}")
        if _is_generation(record):
            generated.append((record, number))
        else:
            rows.extend(_rows(record, path, number, model, task, f"lm-eval {version}"))
    if generated:
        rows.extend(_generation_rows(generated, path, model, task, f"lm-eval {version}"))
    if not rows:
        raise UserError(f"file = {str(path)!r}: no record with a per-document metric")
    return pl.DataFrame(rows, schema={"model": pl.String, "dataset": pl.String, "estimator": pl.String,
                                      "criterion": pl.String, "score": pl.Float64, "error": pl.Int8,
                                      "question_id": pl.String, "source": pl.String})


def _rows(record: dict[str, Any], path: Path, number: int, model: str, task: str,
          source: str) -> list[dict[str, Any]]:
    where = f"file = {str(path)!r}, line {number}"
    options = record.get("filtered_resps")
    if not isinstance(options, list) or not options or not all(_is_loglikelihood(o) for o in options):
        raise UserError(f"{where}: neither a multiple-choice record (filtered_resps = {str(options)[:80]}) nor a "
                        "generation with its samples in resps; CIC reads lm-eval's multiple_choice and "
                        "generate_until tasks")
    scores = option_scores(str(record["doc_id"]), log_probabilities([o[0] for o in options], where,
                                                                    "filtered_resps"))  # lm-eval writes strings
    return _metric_rows(record, where, scores, model, task, source)


def _metric_rows(record: dict[str, Any], where: str, scores: dict[str, float | None], model: str, task: str,
                 source: str) -> list[dict[str, Any]]:
    """One row per (per-document metric, estimator): error = 1 - the metric, the criterion named by its filter."""
    filtered = record.get("filter", "none")
    metrics = record.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        raise UserError(f"{where}: metrics = {str(metrics)[:80]}: lm-eval names the record's per-document metrics "
                        "there (a file from another lm-eval version?)")
    out = []
    for metric in metrics:
        value = record.get(metric)
        if not isinstance(value, int | float) or value not in (0, 1, 0.0, 1.0) or math.isnan(value):
            raise UserError(f"{where}: metric {metric!r} = {value!r} is not 0 or 1 for one document")
        criterion = metric if filtered in (None, "none") else f"{metric}[{filtered}]"
        out.extend({"model": model, "dataset": task, "estimator": name, "criterion": criterion, "score": score,
                    "error": 1 - int(value), "question_id": str(record["doc_id"]), "source": source}
                   for name, score in scores.items())
    return out


def _is_generation(record: dict[str, Any]) -> bool:
    """A generate_until record: `resps` holds one list of generated strings."""
    resps = record.get("resps")
    return (isinstance(resps, list) and len(resps) == 1 and isinstance(resps[0], list) and bool(resps[0])
            and all(isinstance(r, str) for r in resps[0]))


def _generation_rows(records: list[tuple[dict[str, Any], int]], path: Path, model: str, task: str,
                     source: str) -> list[dict[str, Any]]:
    """Every generate_until record's rows: each document's samples scored once, by the sample estimators."""
    samples: dict[str, list[str]] = {}
    for record, number in records:
        texts = [t.strip() for t in record["resps"][0]]
        doc = str(record["doc_id"])
        if len(texts) < 2:
            raise UserError(f"file = {str(path)!r}, line {number}: one generation for document {doc}: sample-based "
                            "scores need several (run the task with `repeats: 10` and sampling on)")
        if samples.setdefault(doc, texts) != texts:
            raise UserError(f"file = {str(path)!r}, line {number}: document {doc} appears with other samples than "
                            "on an earlier line (two runs in one file?)")
    scores = sample_scores(samples, SAMPLE_ESTIMATORS)
    out = []
    for record, number in records:
        out.extend(_metric_rows(record, f"file = {str(path)!r}, line {number}", scores[str(record["doc_id"])],
                                model, task, source))
    return out


def _is_loglikelihood(option: Any) -> bool:
    if not (isinstance(option, list) and len(option) == 2):
        return False
    try:
        float(option[0])  # a number, whatever its value: `log_probabilities` says which are not log-probabilities
    except (TypeError, ValueError):
        return False
    return True


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
