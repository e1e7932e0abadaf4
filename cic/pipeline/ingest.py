"""Production records in: questions a deployed model answered, its uncertainty scores, and correctness labels
that often arrive later — stored next to the pipeline's own runs so recalibration can use them.

A file (Parquet, CSV or JSONL) holds one record a row:

| column | meaning |
|---|---|
| `model`, `stream` | the model that answered and the traffic stream (stored as the dataset name) |
| `question_id` | the record's id within the stream (re-ingesting it updates it: idempotent) |
| `question`, `answer`, `timestamp` | what was asked, what the model answered, when (windows by time use it) |
| `score:<estimator>` | one column per uncertainty score, e.g. `score:semantic_entropy` (higher = less sure) |
| `correct` | optional: true/false (1/0), stored under the criterion named by `label_name` (default `human`) |
| `gold` | optional: the right answer, labelled with a named criterion (`exact_match`, `token_f1[0.5]`, ...) |

A file of `model`, `stream`, `question_id` and `correct` (or `gold`) alone labels records ingested earlier.
Every row is checked before anything is written; a bad row is named (1 = the first record) with its field and
value, and nothing of that file is stored. Each (model, stream) is one run (`split` = "production").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema

if TYPE_CHECKING:
    from cic.store import Store

SUFFIXES = (".parquet", ".pq", ".csv", ".jsonl", ".ndjson")
SCORE_PREFIX = "score:"
SPLIT = "production"
PROMPT_ID = "ingest"
KEY_COLUMNS = ("model", "stream", "question_id")
RECORD_COLUMNS = ("question", "answer", "timestamp")
TRUE_WORDS, FALSE_WORDS = {"true", "1", "yes", "t", "y"}, {"false", "0", "no", "f", "n"}


@dataclass
class IngestStats:
    """What one file added: records (new or updated), labels, and the runs (model, stream) they belong to."""

    file: str
    records: int = 0
    labels: int = 0
    unlabelled: int = 0
    runs: list[dict[str, str]] = field(default_factory=list)


def read_records(path: str | Path) -> pl.DataFrame:
    """The file as a frame of strings and numbers, or one error naming the file and what is wrong."""
    from cic.store.score_files import input_file

    p = input_file(path, SUFFIXES)
    suffix = p.suffix.lower()
    try:
        if suffix == ".csv":
            frame = pl.read_csv(p, infer_schema=False)  # every column as text: checked field by field below
        elif suffix in (".jsonl", ".ndjson"):
            frame = pl.read_ndjson(p)
        else:
            frame = pl.read_parquet(p)
    except Exception as exc:  # polars raises several exception types for unreadable files
        raise ValueError(f"file = {str(p)!r}: cannot be read as {suffix[1:]}: {' '.join(str(exc).split())[:200]}") \
            from None
    if frame.height == 0:
        raise ValueError(f"file = {str(p)!r}: has no records")
    return frame


def _where(source: str, row: int, frame: pl.DataFrame) -> str:
    qid = frame.get_column("question_id")[row] if "question_id" in frame.columns else None
    return f"{source} record {row + 1}" + (f" (question_id {qid!r})" if qid is not None else "")


def _text_column(frame: pl.DataFrame, name: str, source: str, *, allow_empty: bool = False) -> list[str]:
    values = frame.get_column(name).to_list()
    for i, value in enumerate(values):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ValueError(f"{_where(source, i, frame)}: {name} is missing")
        if not isinstance(value, str | int):
            raise ValueError(f"{_where(source, i, frame)}: {name} = {value!r}: expected text")
        if not allow_empty and not str(value).strip():
            raise ValueError(f"{_where(source, i, frame)}: {name} is empty")
    return [str(v) for v in values]


def _bool_column(frame: pl.DataFrame, name: str, source: str) -> list[bool | None]:
    out: list[bool | None] = []
    for i, value in enumerate(frame.get_column(name).to_list()):
        if value is None or (isinstance(value, str) and not value.strip()):
            out.append(None)
        elif isinstance(value, bool):
            out.append(value)
        elif isinstance(value, int | float) and value in (0, 1):
            out.append(bool(value))
        elif isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
            out.append(value.strip().lower() in TRUE_WORDS)
        else:
            raise ValueError(f"{_where(source, i, frame)}: {name} = {value!r}: expected true/false or 1/0 "
                             "(empty when not labelled yet)")
    return out


def _score_column(frame: pl.DataFrame, name: str, source: str) -> list[float | None]:
    out: list[float | None] = []
    for i, value in enumerate(frame.get_column(name).to_list()):
        if value is None or (isinstance(value, str) and not value.strip()):
            out.append(None)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(f"{_where(source, i, frame)}: {name} = {value!r}: expected a finite number "
                             "(empty when the estimator gave none)")
        out.append(number)
    return out


def _time_column(frame: pl.DataFrame, name: str, source: str) -> list[datetime]:
    out = []
    for i, value in enumerate(frame.get_column(name).to_list()):
        moment = value
        if isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                moment = None
        if not isinstance(moment, datetime):
            raise ValueError(f"{_where(source, i, frame)}: {name} = {value!r}: expected an ISO 8601 time such as "
                             "2026-11-23T09:30:00Z")
        out.append(moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC))
    return out


def _check_columns(frame: pl.DataFrame, source: str) -> tuple[list[str], bool]:
    """(score columns, is a labels-only file); errors name what is missing or unknown."""
    missing = [c for c in KEY_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{source} lacks column(s) {', '.join(missing)}; every record needs model, stream, "
                         f"question_id (columns are: {', '.join(frame.columns)})")
    scores = [c for c in frame.columns if c.startswith(SCORE_PREFIX)]
    labels_only = not scores and not any(c in frame.columns for c in RECORD_COLUMNS)
    known = {*KEY_COLUMNS, *RECORD_COLUMNS, "correct", "gold", *scores}
    unknown = [c for c in frame.columns if c not in known]
    if unknown:
        raise ValueError(f"{source}: unknown column(s) {', '.join(unknown)}; columns are model, stream, question_id, "
                         f"question, answer, timestamp, {SCORE_PREFIX}<estimator>, correct, gold")
    if labels_only and "correct" not in frame.columns and "gold" not in frame.columns:
        raise ValueError(f"{source} has neither records (question, answer, timestamp, {SCORE_PREFIX}<estimator>) nor "
                         "labels (correct or gold)")
    if not labels_only:
        absent = [c for c in RECORD_COLUMNS if c not in frame.columns]
        if absent or not scores:
            what = ", ".join(absent + ([] if scores else [f"{SCORE_PREFIX}<estimator>"]))
            raise ValueError(f"{source}: records need {what} (a labels-only file has model, stream, question_id "
                             "and correct or gold alone)")
    for column in scores:
        if not column[len(SCORE_PREFIX):].strip():
            raise ValueError(f"{source}: column {column!r} names no estimator")
    return scores, labels_only


def _check_unique(frame: pl.DataFrame, source: str) -> None:
    keys = frame.select(*KEY_COLUMNS).with_row_index("row")
    repeated = keys.filter(pl.struct(*KEY_COLUMNS).is_duplicated())
    if repeated.height:
        first = repeated.filter(pl.struct(*KEY_COLUMNS) == repeated.select(pl.struct(*KEY_COLUMNS)).row(0)[0])
        rows = ", ".join(str(r + 1) for r in first.get_column("row").to_list()[:3])
        raise ValueError(f"{source}: records {rows} repeat model {first.get_column('model')[0]!r}, stream "
                         f"{first.get_column('stream')[0]!r}, question_id {first.get_column('question_id')[0]!r}")


def run_key_of(model: str, stream: str) -> str:
    """The run key of a (model, stream): what every ingest of that pair writes under."""
    return schema.run_key(model, stream, SPLIT, PROMPT_ID, {"source": "ingest"})


def ingest_file(store: Store, path: str | Path, *, label_name: str = "human", criterion: str | None = None,
                embedder: Any = None, experiment_prefix: str = "cic") -> IngestStats:
    """Check every record of the file, then store it all in one transaction (or nothing)."""
    source = f"file {str(path)!r}"
    frame = read_records(path)
    scores, labels_only = _check_columns(frame, source)
    if "gold" in frame.columns and criterion is None:
        raise ValueError(f"{source} has a gold column: name the criterion that labels answers against it "
                         "(--criterion exact_match, token_f1[0.5], similarity[0.6])")
    if criterion is not None:
        from cic.llm.alignment import parse_criterion

        criterion = parse_criterion(criterion).label
        if criterion == "option_match":
            raise ValueError("criterion = 'option_match': ingested records are open answers; use exact_match, "
                             "token_f1[τ] or similarity[τ]")
        if "gold" not in frame.columns:
            raise ValueError(f"criterion = {criterion!r}: {source} has no gold column to label against")
    if not label_name.strip() or label_name.startswith(("option_match", "similarity", "exact_match", "token_f1")):
        raise ValueError(f"label_name = {label_name!r}: give a name of your own (criteria's names are reserved)")
    for name in KEY_COLUMNS:
        _text_column(frame, name, source)
    _check_unique(frame, source)
    models, streams = frame.get_column("model").cast(pl.String), frame.get_column("stream").cast(pl.String)
    qids = frame.get_column("question_id").cast(pl.String)
    keys = [run_key_of(m, s) for m, s in zip(models, streams, strict=True)]
    correct = _bool_column(frame, "correct", source) if "correct" in frame.columns else [None] * frame.height
    gold = frame.get_column("gold").to_list() if "gold" in frame.columns else [None] * frame.height
    stats = IngestStats(file=str(path))

    if labels_only:
        answers = _stored_answers(store, frame, keys, qids.to_list(), source)
    else:
        questions = _text_column(frame, "question", source)
        answers = _text_column(frame, "answer", source, allow_empty=True)
        observed = _time_column(frame, "timestamp", source)
        values = {c[len(SCORE_PREFIX):].strip(): _score_column(frame, c, source) for c in scores}
    labels = _label_rows(frame, keys, qids.to_list(), answers, correct, gold, label_name, criterion, embedder, source)

    with store.transaction():
        for model, stream in dict.fromkeys(zip(models, streams, strict=True)):
            store.register_run(model, stream, SPLIT, PROMPT_ID, {"source": "ingest"},
                               experiment_prefix=experiment_prefix)
            stats.runs.append({"model": model, "stream": stream, "run_key": run_key_of(model, stream)})
        if not labels_only:
            store.upsert("questions", pl.DataFrame({
                "dataset": streams, "split": SPLIT, "question_id": qids, "question": questions,
                "choices": None, "choice_labels": None, "answer": [g if isinstance(g, str) else "" for g in gold],
                "aliases": [[] for _ in range(frame.height)]}, schema=schema.QUESTIONS.schema))
            store.upsert("generations", pl.DataFrame({
                "run_key": keys, "question_id": qids, "sample_index": 0, "text": answers, "n_tokens": None,
                "logprob_sum": None, "logprob_mean": None, "is_greedy": None, "option_probs": None,
                "flags": [["ingested"] for _ in range(frame.height)]}, schema=schema.GENERATIONS.schema))
            store.upsert("scores", pl.concat([pl.DataFrame({
                "run_key": keys, "question_id": qids, "estimator": name, "value": column},
                schema=schema.SCORES.schema) for name, column in values.items()]))
            store.upsert("observations", pl.DataFrame({
                "run_key": keys, "question_id": qids, "observed_at": observed, "source": Path(path).name},
                schema={k: v for k, v in schema.OBSERVATIONS.schema.items() if k != "created_at"}))
            stats.records = frame.height
        if labels.height:
            store.upsert("labels", labels)
    stats.labels = labels.get_column("question_id").n_unique() if labels.height else 0
    stats.unlabelled = frame.height - stats.labels if not labels_only else 0
    return stats


def _stored_answers(store: Store, frame: pl.DataFrame, keys: list[str], qids: list[str], source: str) -> list[str]:
    """The stored answer of each labelled record; a label for a record never ingested is an error naming it."""
    wanted = pl.DataFrame({"run_key": keys, "question_id": qids}).with_row_index("row")
    stored = store.read("generations", run_key=list(set(keys)), sample_index=0).select("run_key", "question_id",
                                                                                      "text")
    joined = wanted.join(stored, on=["run_key", "question_id"], how="left").sort("row")
    missing = joined.filter(pl.col("text").is_null())
    if missing.height:
        row = int(missing.get_column("row")[0])
        raise ValueError(f"{_where(source, row, frame)}: no ingested record of model "
                         f"{frame.get_column('model')[row]!r}, stream {frame.get_column('stream')[row]!r} has this "
                         "question_id; ingest the record (question, answer, timestamp, scores) first")
    return joined.get_column("text").to_list()


def _label_rows(frame: pl.DataFrame, keys: list[str], qids: list[str], answers: list[str],
                correct: list[bool | None], gold: list[Any], label_name: str, criterion: str | None, embedder: Any,
                source: str) -> pl.DataFrame:
    """LABELS rows: `correct` as given, and `gold` judged by the criterion (records without either: none)."""
    parts = []
    given = [i for i, c in enumerate(correct) if c is not None]
    if given:
        parts.append(pl.DataFrame({
            "run_key": [keys[i] for i in given], "question_id": [qids[i] for i in given], "criterion": label_name,
            "aligned": [correct[i] for i in given], "value": [float(bool(correct[i])) for i in given],
            "created_at": None}, schema=schema.LABELS.schema))
    with_gold = [i for i, g in enumerate(gold) if g is not None and not (isinstance(g, float) and math.isnan(g))
                 and str(g).strip()]
    for i in with_gold:
        if not isinstance(gold[i], str | int):
            raise ValueError(f"{_where(source, i, frame)}: gold = {gold[i]!r}: expected text")
    if with_gold and criterion is not None:
        from cic.llm.alignment import label_generations

        if criterion.startswith("similarity") and embedder is None:
            from cic.llm.embeddings import SentenceEmbedder

            embedder = SentenceEmbedder()
        questions = pl.DataFrame({"question_id": [qids[i] for i in with_gold], "choices": None,
                                  "answer": [str(gold[i]) for i in with_gold],
                                  "aliases": [[] for _ in with_gold]},
                                 schema={"question_id": pl.String, "choices": pl.List(pl.String),
                                         "answer": pl.String, "aliases": pl.List(pl.String)})
        for run_key in dict.fromkeys(keys[i] for i in with_gold):
            rows = [i for i in with_gold if keys[i] == run_key]
            generations = pl.DataFrame({"question_id": [qids[i] for i in rows], "sample_index": 0,
                                        "text": [answers[i] for i in rows]})
            parts.append(label_generations(questions.filter(pl.col("question_id").is_in([qids[i] for i in rows])),
                                           generations, [criterion], run_key=run_key, embedder=embedder))
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema.LABELS.schema)
