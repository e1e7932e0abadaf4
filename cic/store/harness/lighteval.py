"""lighteval `--save-details` output (`details/<model>/<time>/details_<task>|<shots>_<time>.parquet`, one row per
question) as (question, score, error) rows.

- Multiple choice (`sampling_methods` LOGPROBS): `model_response.logprobs` holds each choice's summed
  log-likelihood, in the order of `doc.choices`; the options' probabilities are their softmax and CIC's option
  estimators score them (`one_minus_max_prob`, `option_entropy`).
- Generation (GENERATIVE, a task whose metrics ask for several samples, e.g. `maj@4`): `model_response.text` holds
  the K samples; CIC's sample-based estimators score them (lighteval keeps no token log-probabilities of samples).
- Each per-question metric in `metric` whose values are 0 or 1 (`acc`, `acc_norm`, `em`, `maj@4`) is a criterion,
  error = 1 − its value; fractional metrics (`pass@1:n=4`) are left out. The question id is `doc.id` (lighteval's
  row index in the split). The model comes from the run's results JSON where it lies beside the details, else
  the folder; the task from `doc.task_name`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.store.harness.contract import Once, log_probabilities
from cic.store.harness.samples import SAMPLE_ESTIMATORS, option_scores, sample_scores

if TYPE_CHECKING:
    import polars as pl

_DETAILS = re.compile(r"^details_(?P<task>.+)_(?P<time>\d{4}-\d{2}-\d{2}T[\d\-.]+)\.parquet$")
COLUMNS = ("doc", "metric", "model_response")


def looks_like(record: dict[str, Any]) -> bool:
    """One row of a details file."""
    return set(COLUMNS) <= set(record)


def claims(path: Path) -> bool:
    """A details Parquet file by its name, or a folder holding them."""
    return bool(_DETAILS.match(path.name)) or (path.is_dir() and any(path.glob("**/details_*.parquet")))


def read(path: Path) -> pl.DataFrame:
    import polars as pl

    files = sorted(path.glob("**/details_*.parquet")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"file = {str(path)!r}: holds no lighteval details_*.parquet file")
    return pl.concat([_read_file(f) for f in files])


def _read_file(path: Path) -> pl.DataFrame:
    import polars as pl

    try:
        frame = pl.read_parquet(path)
    except Exception:  # polars raises several types for a file that is not Parquet
        raise UserError(f"file = {str(path)!r}: not a Parquet file (a truncated details file?)") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing or frame.height == 0:
        raise UserError(f"file = {str(path)!r}: no {', '.join(missing) or 'rows'} (a file from another lighteval "
                        "version?); CIC reads the doc, metric and model_response columns of `--save-details`")
    rows = frame.select(*COLUMNS).to_dicts()
    once = Once("question")
    for number, row in enumerate(rows):
        if not isinstance(row["doc"], dict) or row["doc"].get("id") is None:
            raise UserError(f"file = {str(path)!r}, row {number}: no doc.id")
        once.add(str(row["doc"]["id"]), f"file = {str(path)!r}, row {number}")
    model = _model(path)
    criteria = _binary_metrics(rows, path)
    generated = {str(r["doc"]["id"]): _samples(r, path) for r in rows if _generative(r)}
    scores = sample_scores(generated, SAMPLE_ESTIMATORS) if generated else {}
    out = []
    for row in rows:
        doc, question = row["doc"], str(row["doc"]["id"])
        chosen = scores[question] if _generative(row) else option_scores(question, _options(row, path))
        dataset = str(doc.get("task_name") or _task(path)).split("|")[0]
        out.extend({"model": model, "dataset": dataset, "estimator": name, "criterion": criterion, "score": value,
                    "error": 1 - int(row["metric"][criterion]), "question_id": question, "source": "lighteval"}
                   for criterion in criteria for name, value in chosen.items())
    return pl.DataFrame(out, schema={"model": pl.String, "dataset": pl.String, "estimator": pl.String,
                                     "criterion": pl.String, "score": pl.Float64, "error": pl.Int8,
                                     "question_id": pl.String, "source": pl.String})


def _generative(row: dict[str, Any]) -> bool:
    return "GENERATIVE" in (row["doc"].get("sampling_methods") or [])


def _binary_metrics(rows: list[dict[str, Any]], path: Path) -> list[str]:
    """The metrics whose every value is 0 or 1 (a fractional one, like pass@k over n samples, is left out)."""
    names = list(rows[0]["metric"] or {})
    kept = [n for n in names if all((r["metric"] or {}).get(n) in (0, 1) for r in rows)]
    if not kept:
        raise UserError(f"file = {str(path)!r}: no per-question metric is 0 or 1 (metrics: {', '.join(names)}); "
                        "CIC certifies a right/wrong judgement such as acc or em")
    return kept


def _options(row: dict[str, Any], path: Path) -> list[float]:
    """A multiple-choice question's option log-likelihoods, one per choice."""
    logprobs = (row["model_response"] or {}).get("logprobs") or []
    choices = row["doc"].get("choices") or []
    if len(logprobs) < 2 or len(logprobs) != len(choices):
        raise UserError(f"file = {str(path)!r}, question {row['doc']['id']!r}: {len(logprobs)} log-likelihoods for "
                        f"{len(choices)} choices; CIC reads lighteval's loglikelihood (multiple choice) and "
                        "generative tasks")
    return log_probabilities(logprobs, f"file = {str(path)!r}, question {row['doc']['id']!r}",
                             "model_response.logprobs")


def _samples(row: dict[str, Any], path: Path) -> list[str]:
    texts = [str(t).strip() for t in (row["model_response"] or {}).get("text") or []]
    if len(texts) < 2:
        raise UserError(f"file = {str(path)!r}, question {row['doc']['id']!r}: {len(texts)} generation(s); "
                        "sample-based scores need several (give the task a metric over samples, e.g. maj@4, with "
                        "sampling on)")
    return texts


def _task(path: Path) -> str:
    match = _DETAILS.match(path.name)
    return match.group("task") if match else path.stem


def _model(path: Path) -> str:
    """The model_name of the run's results JSON (`results/<model>/results_<time>.json` beside `details/`), else
    the details folder's model path."""
    match = _DETAILS.match(path.name)
    details = next((p for p in path.parents if p.name == "details"), None)
    if match is None or details is None:
        return path.parent.parent.name
    model_dir = path.parent.parent.relative_to(details)
    results = details.parent / "results" / model_dir / f"results_{match.group('time')}.json"
    try:
        named = json.loads(results.read_text())["config_general"]["model_name"]
    except (OSError, ValueError, KeyError, TypeError):
        return str(model_dir)
    return Path(str(named)).name
