"""inspect-ai evaluation logs in JSON (`--log-format json`, or `inspect log convert LOG.eval --to json`) as
(question, score, error) rows. A task run with `--epochs K` (K >= 2) answers each sample K times: the K outputs are
the samples CIC's sample-based estimators score (`cic.store.harness.samples`), and the answer certified is the
first epoch's, judged by each scorer the log holds (a scorer is a criterion; "C" / 1 / true is right, "I" / 0 /
false wrong). The model, the task and inspect-ai's version come from the log's `eval` header. `.eval` logs are
zip archives compressed with zstd, which the Python CIC runs on cannot open: converting them to JSON first is one
inspect command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.store.harness.contract import Once
from cic.store.harness.samples import SAMPLE_ESTIMATORS, sample_scores

if TYPE_CHECKING:
    import polars as pl

RIGHT = ("C", 1, 1.0, True)
WRONG = ("I", 0, 0.0, False)


def looks_like(record: dict[str, Any]) -> bool:
    return isinstance(record.get("eval"), dict) and "task" in record["eval"] and isinstance(record.get("samples"),
                                                                                             list)


def claims(path: Path) -> bool:
    """A zstd `.eval` archive (or a folder of them alone), which only this reader can say how to convert."""
    return path.suffix == ".eval" or (path.is_dir() and any(path.glob("**/*.eval")) and not any(path.glob("**/*.json")))


def read(path: Path) -> pl.DataFrame:
    import polars as pl

    files = sorted(path.glob("**/*.json")) if path.is_dir() else [path]
    if path.suffix == ".eval" or (path.is_dir() and not files and any(path.glob("**/*.eval"))):
        raise UserError(f"file = {str(path)!r}: an inspect-ai .eval log (zstd-compressed); convert it first: "
                        f"inspect log convert {path} --to json --output-dir <dir>, then give <dir>")
    frames = [_read_log(f) for f in files]
    if not frames:
        raise UserError(f"file = {str(path)!r}: holds no inspect-ai JSON log")
    return pl.concat(frames)


def _read_log(path: Path) -> pl.DataFrame:
    import polars as pl

    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"file = {str(path)!r}: not a JSON document (a truncated log?)") from None
    if not isinstance(log, dict) or not looks_like(log):
        raise UserError(f"file = {str(path)!r}: not an inspect-ai log (no eval header with a task and no samples)")
    status = log.get("status", "success")
    if status != "success":
        error = (log.get("error") or {}).get("message") if isinstance(log.get("error"), dict) else log.get("error")
        raise UserError(f"file = {str(path)!r}: status = {status!r}: the evaluation did not finish"
                        f"{f' ({str(error)[:80]})' if error else ''}; CIC reads complete evaluations (rerun it)")
    header = log["eval"]
    task = str(header["task"])
    version = (header.get("packages") or {}).get("inspect_ai", "unknown version")
    model = _model(header)
    by_id = _epochs(log["samples"], path)
    scores = sample_scores({sid: [_text(s) for s in runs] for sid, runs in by_id.items()}, SAMPLE_ESTIMATORS)
    rows = []
    for sid, runs in by_id.items():
        first = runs[0]
        for scorer, value in (first.get("scores") or {}).items():
            error = _error(value, path, sid, scorer)
            rows.extend({"model": model, "dataset": task, "estimator": name, "criterion": scorer, "score": score,
                         "error": error, "question_id": sid, "source": f"inspect-ai {version}"}
                        for name, score in scores[sid].items())
    if not rows:
        raise UserError(f"file = {str(path)!r}: no sample carries a score (run the task with a scorer)")
    return pl.DataFrame(rows, schema={"model": pl.String, "dataset": pl.String, "estimator": pl.String,
                                      "criterion": pl.String, "score": pl.Float64, "error": pl.Int8,
                                      "question_id": pl.String, "source": pl.String})


def _model(header: dict[str, Any]) -> str:
    """The model's name: the local path's last part where inspect ran local weights, else inspect's model name."""
    path = (header.get("model_args") or {}).get("model_path")
    return Path(str(path)).name if path else str(header.get("model", "unknown model"))


def _epochs(samples: list[Any], path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each sample id's runs in epoch order; at least two per id (the samples the estimators need)."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    once = Once("sample (and epoch)")
    for number, sample in enumerate(samples):
        if not isinstance(sample, dict) or "id" not in sample or "output" not in sample:
            raise UserError(f"file = {str(path)!r}: a sample without id or output ({str(sample)[:80]})")
        once.add((str(sample["id"]), int(sample.get("epoch", 1))), f"file = {str(path)!r}, samples[{number}]")
        by_id.setdefault(str(sample["id"]), []).append(sample)
    for sid, runs in by_id.items():
        runs.sort(key=lambda s: int(s.get("epoch", 1)))
        if len(runs) < 2:
            raise UserError(f"file = {str(path)!r}: sample {sid!r} was answered once; sample-based scores need "
                            "several answers (run the task with --epochs 10 and a temperature above 0)")
    return by_id


def _text(sample: dict[str, Any]) -> str:
    choices = (sample.get("output") or {}).get("choices") or []
    content = choices[0].get("message", {}).get("content", "") if choices else ""
    if isinstance(content, list):  # content parts: the text ones, joined
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content).strip()


def _error(value: Any, path: Path, sid: str, scorer: str) -> int:
    judged = value.get("value") if isinstance(value, dict) else value
    if judged in RIGHT:
        return 0
    if judged in WRONG:
        return 1
    raise UserError(f"file = {str(path)!r}: sample {sid!r}, scorer {scorer!r}: value = {judged!r} is neither right "
                    "(C, 1, true) nor wrong (I, 0, false); CIC certifies 0/1 errors")
