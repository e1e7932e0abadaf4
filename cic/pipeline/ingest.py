"""Production records in: questions a deployed model answered, its uncertainty scores, and correctness labels
that often arrive later — stored next to the pipeline's own runs so recalibration can use them.

A file (Parquet, CSV or JSONL) holds one record a row:

| column | meaning |
|---|---|
| `model`, `stream` | the model that answered and the traffic stream (stored as the dataset name) |
| `question_id` | the record's id within the model's stream (re-ingesting it updates it: idempotent) |
| `question`, `answer`, `timestamp` | what was asked, what the model answered, when (windows by time use it) |
| `score:<estimator>` | one column per uncertainty score, e.g. `score:semantic_entropy` (higher = less sure) |
| `correct` | optional: true/false (1/0), stored under the criterion named by `label_name` (default `human`) |
| `gold` | optional: the right answer, labelled with a named criterion (`exact_match`, `token_f1[0.5]`, ...) |
| the column `group` names | optional: the record's group (user segment, tier); stored in stream `<stream>/<group>` |

Grouped records get gates of their own per group, certified at once with `calibration.group_by: dataset`.

A record keeps its group: one whose (model, question_id) is stored in another group of its stream (or, without
`group`, in a group of it) is refused, as are two groups for one record in a file; group values may not
contain '/'.

A file of `model`, `stream`, `question_id` and `correct` (or `gold`) alone labels records ingested earlier.

History stays append-only and checked: a timestamp needs a time zone (or `timezone` names the one naive times
are in) and may not lie beyond now + `max_skew` or before 2000; a label that would change a stored label is
refused unless `relabel`, and then recorded in `label_events` and flagged on every gate whose window held the
record. Records are keyed by (model, stream, question_id): two models' questions never overwrite each other.

The file is read in batches of `batch_rows` records (memory stays bounded for any size): each batch is checked
and staged as Parquet beside the store, checks across the whole file (repeated keys, labels of unknown records,
relabelling) run in DuckDB over the staged files, and only then is anything written — a bad record is named
(1 = the first record) with its field and value, and nothing of that file is stored. A file of up to
`commit_records` records is written in one transaction (a kill stores all or nothing). A larger one is written in
commits of that size — DuckDB keeps the index entries of a transaction's rows in memory, so one transaction
of 10^7 records would need gigabytes — under an `ingests` journal entry that stays 'writing' until the last
commit: recalibration refuses to run on a store with an unfinished ingest, and rerunning the same ingest
(idempotent) completes it.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline import progress
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.record_batches import SUFFIXES, record_batches
from cic.store.ingest_queries import (
    changed_labels,
    first_group_clash,
    first_group_move,
    first_question_in_two_groups,
    first_repeated_key,
    gates_touched,
    new_record_count,
    staged_label_count,
    staged_streams,
    stored_answers,
    unfinished_ingest_files,
    write_staged,
)

if TYPE_CHECKING:
    from cic.store import Store

SCORE_PREFIX = "score:"
SPLIT = "production"
PROMPT_ID = "ingest"
KEY_COLUMNS = ("model", "stream", "question_id")
RECORD_COLUMNS = ("question", "answer", "timestamp")
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "t", "y"), ("false", "0", "no", "f", "n")
BATCH_ROWS = 100_000
COMMIT_RECORDS = 500_000  # a file up to this size is stored in one transaction; a larger one in steps
MEMORY_LIMIT = "1GB"      # DuckDB's limit while ingesting (it spills beyond it; a transaction's index entries cannot)
MAX_SKEW = timedelta(minutes=5)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class IngestOptions:
    """How a file is ingested — declared once, here, and passed from the command (or a deployment's parameters)
    through the flow and its task to `ingest_file`: the criterion name of a `correct` column, the criterion that
    labels a `gold` column, whether labels may change, the clock skew allowed (5m, 1h), the zone of timestamps
    written without one, the experiment prefix of the streams' runs, and the column holding each record's group."""

    label_name: str = "human"
    criterion: str | None = None
    relabel: bool = False
    max_skew: str = "5m"
    timezone: str | None = None
    experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX
    group: str | None = None

    def skew(self, option: str = "max_skew") -> timedelta:
        """`max_skew` as a duration (an absurd or negative one refused, naming `option`)."""
        from cic.pipeline.durations import parse_duration

        return parse_duration(self.max_skew, option)


@dataclass
class IngestStats:
    """What one file added: records (new or updated), labels, relabelled labels, gates flagged by relabelling,
    and the runs (model, stream) they belong to."""

    file: str
    records: int = 0
    labels: int = 0
    unlabelled: int = 0
    relabelled: int = 0
    flagged_gates: list[str] = field(default_factory=list)
    runs: list[dict[str, str]] = field(default_factory=list)
    new: int | None = None  # records the store did not hold before (None: a file of labels alone)


def run_key_of(model: str, stream: str) -> str:
    """The run key of a (model, stream): what every ingest of that pair writes under."""
    return schema.run_key(model, stream, SPLIT, PROMPT_ID, {"source": "ingest"})


def estimator_name(column: str) -> str:
    """The estimator a `score:` column names, whitespace removed (`score: semantic_entropy ` → semantic_entropy)."""
    return re.sub(r"\s+", "", column[len(SCORE_PREFIX):])


@dataclass(frozen=True)
class Layout:
    """What the file holds, decided from its columns: score columns (column → estimator), labels-only or not."""

    columns: tuple[str, ...]
    scores: dict[str, str]
    labels_only: bool
    group: str | None = None

    @classmethod
    def of(cls, columns: list[str], source: str, group: str | None = None) -> Layout:
        if group is not None:
            if group in (*KEY_COLUMNS, *RECORD_COLUMNS, "correct", "gold") or group.startswith(SCORE_PREFIX):
                raise UserError(f"group = {group!r}: that column already has a role in a records file; name the "
                                 "column that holds each record's group (e.g. tier, segment)")
            if group not in columns:
                raise UserError(f"group = {group!r}: {source} has no such column (columns are: "
                                 f"{', '.join(columns)})")
        missing = [c for c in KEY_COLUMNS if c not in columns]
        if missing:
            raise UserError(f"{source} lacks column(s) {', '.join(missing)}; every record needs model, stream, "
                             f"question_id (columns are: {', '.join(columns)})")
        raw_scores = [c for c in columns if c.startswith(SCORE_PREFIX)]
        labels_only = not raw_scores and not any(c in columns for c in RECORD_COLUMNS)
        known = {*KEY_COLUMNS, *RECORD_COLUMNS, "correct", "gold", *raw_scores, *([group] if group else [])}
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise UserError(f"{source}: unknown column(s) {', '.join(map(repr, unknown))}; columns are model, stream, "
                             f"question_id, question, answer, timestamp, {SCORE_PREFIX}<estimator>, correct, gold")
        if labels_only and "correct" not in columns and "gold" not in columns:
            raise UserError(f"{source} has neither records (question, answer, timestamp, {SCORE_PREFIX}<estimator>) "
                             "nor labels (correct or gold)")
        if not labels_only:
            absent = [c for c in RECORD_COLUMNS if c not in columns]
            if absent or not raw_scores:
                what = ", ".join(absent + ([] if raw_scores else [f"{SCORE_PREFIX}<estimator>"]))
                raise UserError(f"{source}: records need {what} (a labels-only file has model, stream, question_id "
                                 "and correct or gold alone)")
        scores: dict[str, str] = {}
        for column in raw_scores:
            name = estimator_name(column)
            if not name:
                raise UserError(f"{source}: column {column!r} names no estimator")
            clash = [c for c, n in scores.items() if n == name]
            if clash:
                raise UserError(f"{source}: columns {clash[0]!r} and {column!r} both name estimator {name!r} "
                                 "(names are compared without spaces); keep one")
            scores[column] = name
        return cls(tuple(columns), scores, labels_only, group)

    def conform(self, frame: pl.DataFrame, first: int, source: str) -> pl.DataFrame:
        """A batch with exactly the file's columns (a JSONL line may omit a key: null)."""
        extra = [c for c in frame.columns if c not in self.columns]
        if extra:
            raise UserError(f"{source}: column(s) {', '.join(map(repr, extra))} first appear at or after record "
                             f"{first}; give every record the same fields")
        missing = [c for c in self.columns if c not in frame.columns]
        return frame.with_columns(pl.lit(None).alias(c) for c in missing).select(self.columns)


@dataclass(frozen=True)
class Checks:
    """How records are judged: the clock (`now`), the allowed skew, the zone of naive timestamps."""

    now: datetime
    max_skew: timedelta = MAX_SKEW
    timezone: str | None = None
    stamp: datetime | None = None  # what rows are stamped with: a rerun of a cut-off ingest keeps its first one


class _Batch:
    """One batch of a file and where its records sit in it, for errors that name a record."""

    def __init__(self, frame: pl.DataFrame, first: int, source: str) -> None:
        self.frame, self.first, self.source = frame, first, source

    def fail(self, mask: pl.Series, message: Any) -> None:
        """Raise naming the first record where `mask` is true; `message(value_row_index)` says what is wrong."""
        hits = mask.fill_null(False)
        if hits.any():
            row = int(hits.arg_true()[0])
            raise UserError(f"{self.where(row)}: {message(row)}")

    def where(self, row: int) -> str:
        qid = self.frame.get_column("question_id")[row] if "question_id" in self.frame.columns else None
        return f"{self.source} record {self.first + row}" + (f" (question_id {qid!r})" if qid is not None else "")

    def value(self, name: str, row: int) -> Any:
        return self.frame.get_column(name)[row]


def _as_text(batch: _Batch, name: str) -> pl.Series:
    """A column as text: strings and integers are; any other value is an error naming its record."""
    column = batch.frame.get_column(name)
    if column.dtype != pl.String and not column.dtype.is_integer() and column.dtype != pl.Null:
        batch.fail(column.is_not_null(), lambda r: f"{name} = {batch.value(name, r)!r}: expected text")
    return column.cast(pl.String)


def _text(batch: _Batch, name: str, *, allow_empty: bool = False) -> pl.Series:
    text = _as_text(batch, name)
    batch.fail(text.is_null(), lambda r: f"{name} is missing")
    if not allow_empty:
        batch.fail(text.str.strip_chars() == "", lambda r: f"{name} is empty")
    return text


def _optional_text(batch: _Batch, name: str) -> pl.Series:
    """Text that may be absent: null or blank is None."""
    text = _as_text(batch, name)
    return text.set((text.str.strip_chars() == "").fill_null(False), None)  # type: ignore[arg-type]


def _scores(batch: _Batch, name: str) -> pl.Series:
    column = batch.frame.get_column(name)
    if column.dtype == pl.Boolean:
        batch.fail(column.is_not_null(), lambda r: f"{name} = {batch.value(name, r)!r}: expected a finite number")
    if column.dtype == pl.String:
        blank = column.str.strip_chars() == ""
        numbers = column.set(blank, None).str.strip_chars().cast(pl.Float64, strict=False)  # type: ignore[arg-type]
        bad = column.is_not_null() & ~blank.fill_null(False) & numbers.is_null()
    elif column.dtype.is_numeric() or column.dtype == pl.Null:
        numbers, bad = column.cast(pl.Float64), pl.Series([False] * column.len())
    else:
        numbers, bad = column.cast(pl.Float64, strict=False), column.is_not_null()
    bad = bad | numbers.is_nan().fill_null(False) | numbers.is_infinite().fill_null(False)
    batch.fail(bad, lambda r: f"{name} = {batch.value(name, r)!r}: expected a finite number (empty when the "
                              "estimator gave none)")
    return numbers


def _bools(batch: _Batch, name: str) -> pl.Series:
    column = batch.frame.get_column(name)
    if column.dtype == pl.Boolean:
        return column
    if column.dtype == pl.Null:
        return column.cast(pl.Boolean)
    if column.dtype == pl.String:
        words = column.str.strip_chars().str.to_lowercase()
        known = words.is_in([*TRUE_WORDS, *FALSE_WORDS]) | (words == "") | words.is_null()
        out = pl.Series(name, [None] * column.len(), dtype=pl.Boolean)
        out = out.set(words.is_in(list(TRUE_WORDS)).fill_null(False), True)  # type: ignore[arg-type]
        out = out.set(words.is_in(list(FALSE_WORDS)).fill_null(False), False)  # type: ignore[arg-type]
        bad = ~known
    elif column.dtype.is_numeric():
        numbers = column.cast(pl.Float64)
        bad = column.is_not_null() & ~numbers.is_in([0.0, 1.0]).fill_null(False)
        out = numbers.cast(pl.Boolean, strict=False)
    else:
        bad, out = column.is_not_null(), column.cast(pl.Boolean, strict=False)
    batch.fail(bad, lambda r: f"{name} = {batch.value(name, r)!r}: expected true/false or 1/0 (empty when not "
                              "labelled yet)")
    return out


def _parse_time(value: Any, zone: Any) -> datetime | None | str:
    """A UTC datetime, None when unparseable, or 'naive' when it has no zone and none was given."""
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(moment, datetime):
        return None
    if moment.tzinfo is None:
        if zone is None:
            return "naive"
        moment = moment.replace(tzinfo=zone)
    return moment.astimezone(UTC)


def _times(batch: _Batch, checks: Checks) -> pl.Series:
    """Timestamps as UTC; naive ones refused unless the zone is given; absurd ones (future beyond the skew, or
    before 2000) refused — one such record would freeze recalibration windows for its key."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(checks.timezone) if checks.timezone else None
    column = batch.frame.get_column("timestamp")
    if isinstance(column.dtype, pl.Datetime):
        batch.fail(column.is_null(), lambda r: "timestamp is missing")
        if column.dtype.time_zone is None:
            if zone is None:
                batch.fail(column.is_not_null(), lambda r: f"timestamp = '{batch.value('timestamp', r)}' has no time "
                                                           "zone; write it with one (…Z or +01:00) or name the zone of "
                                                           "naive times (--timezone Europe/Berlin)")
            column = column.dt.replace_time_zone(checks.timezone, ambiguous="earliest", non_existent="null")
        times = column.dt.convert_time_zone("UTC").cast(pl.Datetime("us", "UTC"))
        batch.fail(times.is_null(), lambda r: f"timestamp = '{batch.value('timestamp', r)}' does not exist in "
                                              f"{checks.timezone}")
    else:
        parsed = [_parse_time(v, zone) for v in column.to_list()]
        for row, moment in enumerate(parsed):
            if moment is None:
                raise UserError(f"{batch.where(row)}: timestamp = {batch.value('timestamp', row)!r}: expected an "
                                 "ISO 8601 time such as 2026-11-23T09:30:00Z")
            if moment == "naive":
                raise UserError(f"{batch.where(row)}: timestamp = {batch.value('timestamp', row)!r} has no time "
                                 "zone; write it with one (…Z or +01:00) or name the zone of naive times "
                                 "(--timezone Europe/Berlin)")
        times = pl.Series("timestamp", parsed, dtype=pl.Datetime("us", "UTC"))
    limit = checks.now + checks.max_skew
    now_text = checks.now.strftime("%Y-%m-%d %H:%M:%S")
    batch.fail(times > limit, lambda r: f"timestamp = {times[r].isoformat()} lies {_duration(times[r] - checks.now)} "
                                        f"in the future (now {now_text} UTC, allowed clock skew "
                                        f"{_duration(checks.max_skew)}); fix the clock that wrote it, or raise "
                                        "--max-skew")
    batch.fail(times < EARLIEST, lambda r: f"timestamp = {times[r].isoformat()} is before "
                                           f"{EARLIEST:%Y-%m-%d}: not a time production could have seen it")
    return times


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


class _Stage:
    """Staged Parquet files of one ingest (records, scores, labels, label keys), in a temporary directory
    beside the store; removed when the ingest ends, stored or not."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.files: dict[str, list[str]] = {"records": [], "scores": [], "labels": [], "keys": [], "changed": []}

    def add(self, kind: str, frame: pl.DataFrame) -> str:
        path = self.dir / f"{kind}-{len(self.files[kind]):06d}.parquet"
        frame.write_parquet(path)
        self.files[kind].append(str(path))
        return str(path)

    def has(self, kind: str) -> bool:
        return bool(self.files[kind])


def ingest_file(store: Store, path: str | Path, options: IngestOptions = IngestOptions(), *, embedder: Any = None,
                now: datetime | None = None, batch_rows: int = BATCH_ROWS,
                commit_records: int = COMMIT_RECORDS) -> IngestStats:
    """Check every record of the file (batch by batch, then across the file), then store it all in one
    transaction, or nothing."""
    from cic.store.score_files import input_file

    label_name, relabel, timezone, group = options.label_name, options.relabel, options.timezone, options.group
    experiment_prefix, max_skew = options.experiment_prefix, options.skew()
    p = input_file(path, SUFFIXES)
    source = f"file {str(p)!r}"
    criterion = _checked_options(label_name, options.criterion, timezone, max_skew)
    checks = Checks(now=now or datetime.now(UTC), max_skew=max_skew, timezone=timezone)
    digest = file_digest(p)
    journal = _journal(store, digest)
    if journal is not None and journal["state"] == "writing":  # a cut-off ingest of these bytes: complete it
        if _staged_manifest(store, digest) is not None:
            return complete_ingest(store, digest, file=p)
        checks = Checks(now=checks.now, max_skew=max_skew, timezone=timezone, stamp=journal["started_at"])
    stats = IngestStats(file=str(path))
    with tempfile.TemporaryDirectory(prefix=".cic-ingest-", dir=store.path.parent) as tmp, \
            store.memory_limit(MEMORY_LIMIT):
        stage = _Stage(Path(tmp))
        layout = None
        for first, frame in record_batches(p, batch_rows):
            if layout is None:
                layout = Layout.of(frame.columns, source, group)
                if "gold" in layout.columns and criterion is None:
                    raise UserError(f"{source} has a gold column: name the criterion that labels answers against "
                                     "it (--criterion exact_match, token_f1[0.5], similarity[0.6])")
                if criterion is not None and "gold" not in layout.columns:
                    raise UserError(f"criterion = {criterion!r}: {source} has no gold column to label against")
            batch = _Batch(layout.conform(frame, first, source), first, source)
            embedder = _stage_batch(store, stage, batch, layout, checks, label_name, criterion, embedder)
            stats.records += 0 if layout.labels_only else batch.frame.height
        if layout is None:
            raise UserError(f"file = {str(p)!r}: has no records")
        _check_unique(store, stage, source)
        _check_groups(store, stage, source)
        if not layout.labels_only:
            stats.new = new_record_count(store, stage.files["keys"])
        changed = _changed_labels(store, stage, source, relabel)
        _write(store, stage, layout, p, checks.stamp or checks.now, changed, stats, experiment_prefix,
               commit_files=max(1, commit_records // batch_rows), digest=digest)
    return stats


def _checked_options(label_name: str, criterion: str | None, timezone: str | None, max_skew: timedelta) -> str | None:
    if not label_name.strip() or label_name.startswith(("option_match", "similarity", "exact_match", "token_f1")):
        raise UserError(f"label_name = {label_name!r}: give a name of your own (criteria's names are reserved)")
    if max_skew < timedelta(0):
        raise UserError(f"max_skew = {max_skew}: must not be negative")
    if timezone is not None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise UserError(f"timezone = {timezone!r}: not a time zone name (e.g. UTC, Europe/Berlin)") from None
    if criterion is None:
        return None
    from cic.llm.alignment import parse_criterion

    label = parse_criterion(criterion).label
    if label == "option_match":
        raise UserError("criterion = 'option_match': ingested records are open answers; use exact_match, "
                         "token_f1[τ] or similarity[τ]")
    return label


def _stage_batch(store: Store, stage: _Stage, batch: _Batch, layout: Layout, checks: Checks, label_name: str,
                 criterion: str | None, embedder: Any) -> Any:
    """Check one batch field by field and stage its rows; returns the embedder (made once, when needed)."""
    models, streams, qids = (_text(batch, c) for c in KEY_COLUMNS)
    bases = streams
    if layout.group is not None:
        groups = _text(batch, layout.group)
        batch.fail(groups.str.contains("/", literal=True), lambda r: f"{layout.group} = {groups[r]!r}: a group may "
                   "not contain '/' (the record is stored in stream '<stream>/<group>')")
        streams = (streams + "/" + groups).alias("stream")
    pairs = pl.DataFrame({"model": models, "stream": streams}).unique()
    keys_of = {(m, s): run_key_of(m, s) for m, s in pairs.iter_rows()}
    run_keys = pl.Series("run_key", [keys_of[(m, s)] for m, s in zip(models, streams, strict=True)])
    record = pl.int_range(batch.first, batch.first + batch.frame.height, dtype=pl.Int64, eager=True).alias("record")
    keys = pl.DataFrame({"run_key": run_keys, "model": models, "stream": streams, "question_id": qids,
                         "record": record, "base": bases})
    correct = _bools(batch, "correct") if "correct" in layout.columns else None
    gold = _optional_text(batch, "gold") if "gold" in layout.columns else None
    if layout.labels_only:
        stored = stored_answers(store, stage.add("keys", keys))
        missing = stored.get_column("text").is_null()
        batch.fail(missing, lambda r: f"no ingested record of model {models[r]!r}, stream {streams[r]!r} has this "
                                      "question_id; ingest the record (question, answer, timestamp, scores) first"
                                      " (records ingested with --group COL are in stream '<stream>/<group>': "
                                      "label them with --group COL too)")
        answers = stored.get_column("text")
    else:
        questions = _text(batch, "question")
        answers = _text(batch, "answer", allow_empty=True)
        observed = _times(batch, checks)
        scores = {name: _scores(batch, column) for column, name in layout.scores.items()}
        stage.add("keys", keys)
        stage.add("records", keys.with_columns(question=questions, answer=answers, observed_at=observed,
                                               gold=gold if gold is not None else pl.lit(None, dtype=pl.String)))
        stage.add("scores", pl.concat([pl.DataFrame({"run_key": run_keys, "question_id": qids, "estimator": name,
                                                     "value": values}, schema=schema.SCORES.schema)
                                       for name, values in scores.items()]))
    labels = []
    if correct is not None:
        given = correct.is_not_null()
        labels.append(keys.filter(given).with_columns(criterion=pl.lit(label_name), aligned=correct.filter(given),
                                                      value=correct.filter(given).cast(pl.Float64)))
    if gold is not None and criterion is not None:
        judged, embedder = _judge(keys, answers, gold, criterion, embedder)
        labels.append(judged)
    columns = ["run_key", "model", "stream", "question_id", "record", "criterion", "aligned", "value"]
    if labels and sum(f.height for f in labels):
        stage.add("labels", pl.concat([f.select(columns) for f in labels]))
    return embedder


def _judge(keys: pl.DataFrame, answers: pl.Series, gold: pl.Series, criterion: str, embedder: Any) -> tuple[
        pl.DataFrame, Any]:
    """Label each record with a gold answer by the criterion (records without one get no label)."""
    from cic.llm.alignment import label_generations

    if criterion.startswith("similarity") and embedder is None:
        from cic.llm.embeddings import SentenceEmbedder

        embedder = SentenceEmbedder()
    rows = keys.with_columns(text=answers, gold=gold).filter(pl.col("gold").is_not_null())
    parts = []
    for (run_key,), group in rows.partition_by("run_key", as_dict=True).items():
        questions = pl.DataFrame({"question_id": group["question_id"], "choices": None, "answer": group["gold"],
                                  "aliases": [[] for _ in range(group.height)]},
                                 schema={"question_id": pl.String, "choices": pl.List(pl.String),
                                         "answer": pl.String, "aliases": pl.List(pl.String)})
        generations = group.select("question_id", pl.lit(0).alias("sample_index"), "text")
        judged = label_generations(questions, generations, [criterion], run_key=run_key, embedder=embedder)
        parts.append(group.select("run_key", "model", "stream", "question_id", "record")
                     .join(judged.select("question_id", "criterion", "aligned", "value"), on="question_id"))
    empty = pl.DataFrame(schema={"run_key": pl.String, "model": pl.String, "stream": pl.String,
                                 "question_id": pl.String, "record": pl.Int64, "criterion": pl.String,
                                 "aligned": pl.Boolean, "value": pl.Float64})
    return (pl.concat(parts) if parts else empty), embedder


def _check_unique(store: Store, stage: _Stage, source: str) -> None:
    """No (model, stream, question_id) twice in the file (checked in DuckDB over every staged batch)."""
    repeated = first_repeated_key(store, stage.files["keys"])
    if repeated:
        model, stream, qid, records = repeated
        raise UserError(f"{source}: records {', '.join(map(str, records))} repeat model {model!r}, stream "
                         f"{stream!r}, question_id {qid!r}")


def _check_groups(store: Store, stage: _Stage, source: str) -> None:
    """A record keeps its group: not two groups in one file, not another group than the one it is stored in."""
    split = first_question_in_two_groups(store, stage.files["keys"])
    if split:
        model, base, qid, streams, records = split
        raise UserError(f"{source}: records {', '.join(map(str, records))} put question_id {qid!r} of model "
                         f"{model!r}, stream {base!r} in two groups ({' and '.join(map(repr, streams))}); a record "
                         "has one group")
    clash = first_group_clash(store, stage.files["keys"])
    if clash:
        record, model, stream, base, stored_base = clash
        stored = f"a group of stream {stored_base!r}" if stored_base else "a stream of its own (no group)"
        now = f"a group of stream {base!r}" if base != stream else "a stream of its own (no group)"
        raise UserError(f"{source} record {record}: stream {stream!r} of model {model!r} is stored as {stored}, and "
                         f"this file would make it {now}; give the group or the stream another name")
    moved = first_group_move(store, stage.files["keys"])
    if moved:
        record, model, qid, stream, stored = moved
        raise UserError(f"{source} record {record} (question_id {qid!r}): model {model!r} has this question stored "
                         f"in stream {stored!r}, not {stream!r}; a record keeps its group — ingest it with the "
                         "group it was stored with, or under a new question_id")


def _changed_labels(store: Store, stage: _Stage, source: str, relabel: bool) -> pl.DataFrame | None:
    """Stored labels this file would change: refused unless `relabel` (then returned, to be recorded)."""
    if not stage.has("labels"):
        return None
    changed = changed_labels(store, stage.files["labels"])
    if changed.height == 0:
        return None
    if not relabel:
        row = changed.row(0, named=True)
        raise UserError(f"{source} record {row['record']} (question_id {row['question_id']!r}): would change the "
                         f"stored {row['criterion']} label of model {row['model']!r}, stream {row['stream']!r} from "
                         f"{'correct' if row['old_aligned'] else 'wrong'} to "
                         f"{'correct' if row['new_aligned'] else 'wrong'} ({changed.height} stored label(s) in all); "
                         "history is append-only — pass --relabel to change them (recorded, and every gate whose "
                         "window held them is flagged)")
    return changed


def _write(store: Store, stage: _Stage, layout: Layout, path: Path, now: datetime, changed: pl.DataFrame | None,
           stats: IngestStats, experiment_prefix: str, commit_files: int, digest: str) -> None:
    """Everything staged: runs, questions (per model), answers, scores,
    times, labels, and for a relabelling its events and the gates it flags. Up to `commit_files` staged batches
    of each kind go in one transaction; a larger file commits in steps under its `ingests` journal entry
    ('writing' until the last step; recalibration waits for it and rerunning the ingest completes it)."""
    from cic.pipeline.gates import flag_gates

    pairs = staged_streams(store, stage.files["keys"])
    steps = [(kind, files[i:i + commit_files]) for kind in ("records", "scores", "labels")
             for files in [stage.files[kind]] for i in range(0, len(files), commit_files)]
    plan = _plan(steps)
    previous = _journal(store, digest)
    # a cut-off ingest of these bytes rerun without its staged data: the steps it committed are skipped when it
    # staged the same steps (upserting half a million stored rows again costs several times a fresh ingest)
    first = int(previous["committed"] or 0) if previous is not None and previous["state"] == "writing" and \
        previous["plan"] == plan else 0
    journal = {"digest": digest, "file": str(path.resolve()), "records": stats.records,
               "started_at": now, "created_at": None, "plan": plan, "committed": first}
    if stage.has("labels"):
        stats.labels = staged_label_count(store, stage.files["labels"])
    stats.unlabelled = 0 if layout.labels_only else stats.records - stats.labels
    journaled = not (len(steps) <= 3 and len({kind for kind, _ in steps}) == len(steps))
    if journaled:  # its checked data outlives a kill: the journal can be completed from it, or abandoned
        steps = _persist(store, digest, path, now, steps, stats, committed=first)
    with store.transaction():
        store.upsert("runs", pl.DataFrame({
            "run_key": [run_key_of(m, s) for m, s, _ in pairs], "model": [m for m, _, _ in pairs],
            "dataset": [s for _, s, _ in pairs], "split": SPLIT, "prompt_id": PROMPT_ID,
            "generation_config": [schema.canonical_json({"source": "ingest"} if s == b else {  # the key is the same
                "source": "ingest", "stream": b, "group_column": layout.group}) for _, s, b in pairs],
            "created_at": None, "experiment_prefix": experiment_prefix, "unanswered": None},
            schema=schema.RUNS.schema))  # every (model, stream) at once
        stats.runs.extend({"model": m, "stream": s, "run_key": run_key_of(m, s)} for m, s, _ in pairs)
        if changed is not None:
            store.upsert("label_events", changed.select(
                pl.struct("run_key", "question_id", "criterion").map_elements(
                    lambda r: schema.value_hash(r, now.isoformat(), path.name), return_dtype=pl.String)
                .alias("event_id"), "run_key", "question_id", "criterion", "old_aligned", "new_aligned",
                pl.lit(path.name).alias("source"), pl.lit(now).alias("created_at")))
            stats.relabelled = changed.height
            touched = gates_touched(store, stage.add("changed", changed))
            stats.flagged_gates = flag_gates(store, {
                gate: f"labels changed under this gate: {n} label(s) in its window relabelled by {path.name} "
                      f"at {now:%Y-%m-%d %H:%M} UTC; recalibrate and review before trusting it"
                for gate, n in touched.items()})
        if not journaled:  # one step per kind: all at once
            for kind, files in steps:
                _write_step(store, kind, files, path, now, digest)
            steps = []
        store.upsert("ingests", pl.DataFrame([{**journal, "state": "writing" if steps else "done",
                                               "finished_at": None if steps else now}],
                                             schema=schema.INGESTS.schema))
    if steps:  # a large file: one commit per step, the journal says it is unfinished
        _commit_steps(store, digest, steps, first, path.name, now)


def _plan(steps: list[tuple[str, list[str]]]) -> str:
    """The commit steps as JSON: each step's kind and the rows of each staged file (Parquet metadata only)."""
    import json

    import pyarrow.parquet as pq

    return json.dumps([[kind, [pq.read_metadata(f).num_rows for f in files]] for kind, files in steps])


def _write_step(store: Store, kind: str, files: list[str], path: Path, now: datetime, digest: str) -> None:
    """Upsert one kind of staged file into its tables, as written by the ingest `digest`."""
    write_staged(store, kind, files, path.name, now, SPLIT, digest)


MANIFEST = "manifest.json"


def staging_dir(store: Store, digest: str) -> Path:
    """Where a journaled ingest keeps its checked, staged data until its last commit (beside the store, named by
    the store and the file's sha256): what `complete_ingest` completes from and `abandon_ingest` removes."""
    return store.path.parent / f".cic-ingest-{store.path.name}-{digest[:16]}"


def _persist(store: Store, digest: str, path: Path, now: datetime, steps: list[tuple[str, list[str]]],
             stats: IngestStats, *, committed: int = 0) -> list[tuple[str, list[str]]]:
    """Move the steps' staged files into the ingest's staging directory and write its manifest (last, so a
    manifest means the staged data is complete); returns the steps with their new paths."""
    import os
    import shutil

    target = staging_dir(store, digest)
    shutil.rmtree(target, ignore_errors=True)  # a superseded attempt's
    target.mkdir()
    moved = []
    for kind, files in steps:
        names = []
        for file in files:
            name = f"{kind}-{Path(file).name}"
            os.replace(file, target / name)
            names.append(name)
        moved.append((kind, names))
    _write_manifest(target, {"digest": digest, "file": str(path.resolve()), "source": path.name,
                             "stamp": now.isoformat(), "records": stats.records, "labels": stats.labels,
                             "steps": moved, "committed": committed})
    return [(kind, [str(target / n) for n in names]) for kind, names in moved]


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    import json
    import os

    partial = directory / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest))
    os.replace(partial, directory / MANIFEST)


def _staged_manifest(store: Store, digest: str) -> dict[str, Any] | None:
    """The manifest of an ingest's staged data when it is complete (the manifest and every file it names), else
    None."""
    import json

    directory = staging_dir(store, digest)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("digest") != digest:
        return None
    if not all((directory / name).is_file() for _, names in manifest["steps"] for name in names):
        return None
    return manifest


def _commit_steps(store: Store, digest: str, steps: list[tuple[str, list[str]]], first: int, source: str,
                  stamp: datetime, file: Path | None = None) -> None:
    """Commit the steps from `first` on, one transaction each (the manifest counts them after each commit, so a
    completion redoes at most one: upserts are idempotent), then mark the journal done and drop the staged data."""
    import shutil

    directory = staging_dir(store, digest)
    manifest = _staged_manifest(store, digest)
    journal = store.read("ingests", digest=digest).row(0, named=True)
    for index in range(first, len(steps)):
        kind, files = steps[index]
        with store.transaction():
            _write_step(store, kind, files, Path(source), stamp, digest)
            store.upsert("ingests", pl.DataFrame([{**journal, "committed": index + 1}], schema=schema.INGESTS.schema))
        if manifest is not None:
            _write_manifest(directory, {**manifest, "committed": index + 1})
        progress.report(f"ingest {digest[:12]} commits", index + 1, len(steps))
    with store.transaction():
        row = store.read("ingests", digest=digest).row(0, named=True)
        store.upsert("ingests", pl.DataFrame([{**row, "state": "done", "finished_at": datetime.now(UTC),
                                               **({"file": str(file.resolve())} if file else {})}],
                                             schema=schema.INGESTS.schema))
    shutil.rmtree(directory, ignore_errors=True)


def _journal(store: Store, digest: str) -> dict[str, Any] | None:
    rows = store.read("ingests", digest=digest)
    return rows.row(0, named=True) if rows.height else None


def find_ingest(store: Store, ingest_id: str, option: str) -> dict[str, Any]:
    """The unfinished journal entry that `ingest_id` names: its sha256 (or a prefix of at least 6 characters, as
    the recalibration refusal shows) or its file's path."""
    text = ingest_id.strip()
    rows = store.read("ingests")
    by_file = rows.filter(pl.col("file") == str(Path(text).expanduser().resolve())) if text else rows.clear()
    found = by_file if by_file.height else (rows.filter(pl.col("digest").str.starts_with(text.lower()))
                                            if len(text) >= 6 else rows.clear())
    unfinished = ", ".join(f"{r['digest'][:12]} ({r['file']})" for r in rows.filter(state="writing")
                           .iter_rows(named=True)) or "none"
    if found.height != 1:
        why = "matches several; give more characters" if found.height else "names no ingest journal entry"
        raise UserError(f"{option} = {ingest_id!r}: {why} (unfinished ingests in {store.path}: {unfinished})")
    row = found.row(0, named=True)
    if row["state"] != "writing":
        raise UserError(f"{option} = {ingest_id!r}: the ingest of {row['file']!r} is {row['state']}, not "
                         f"unfinished; nothing to do (unfinished ingests: {unfinished})")
    return row


def complete_ingest(store: Store, ingest_id: str, *, file: Path | None = None) -> IngestStats:
    """Finish a cut-off ingest from its staged data (checked before its first commit), without its file: the
    steps not yet committed, then the journal marked done. Refused, saying what to do, when that data is gone."""
    journal = find_ingest(store, ingest_id, "--complete")
    digest = journal["digest"]
    manifest = _staged_manifest(store, digest)
    if manifest is None:
        raise UserError(f"--complete = {ingest_id!r}: the staged data of the ingest of {journal['file']!r} is gone "
                         f"or incomplete ({staging_dir(store, digest)}); rerun `cic ingest FILE` with that file's "
                         f"bytes (any name) to complete it, or `cic ingest --abandon {digest[:12]}` to undo what it "
                         "stored")
    directory = staging_dir(store, digest)
    steps = [(kind, [str(directory / n) for n in names]) for kind, names in manifest["steps"]]
    stats = IngestStats(file=str(file or journal["file"]), records=int(manifest["records"]),
                        labels=int(manifest["labels"]))
    _commit_steps(store, digest, steps, max(int(manifest["committed"]), int(journal["committed"] or 0)),
                  manifest["source"],
                  datetime.fromisoformat(manifest["stamp"]), file)
    return stats


def abandon_ingest(store: Store, ingest_id: str) -> dict[str, int]:
    """Undo a cut-off ingest in one transaction: every row it stored first that no other ingest (done or
    unfinished) wrote since (records, questions, answers, scores, labels, the runs it registered that hold
    nothing else), labels it relabelled and nothing rewrote since back to their old value, its
    label events and the gate flags they raised; the journal entry is marked abandoned and its staged data
    removed. Returns rows removed per table."""
    import shutil

    from cic.store.database import delete_ingest_rows

    journal = find_ingest(store, ingest_id, "--abandon")
    digest = journal["digest"]
    manifest = _staged_manifest(store, digest)
    directory = staging_dir(store, digest)
    staged = None if manifest is None else {kind: [str(directory / n) for k, names in manifest["steps"] if k == kind
                                                   for n in names] for kind in ("records", "labels")}
    with store.transaction():
        done = delete_ingest_rows(store, stamp=journal["started_at"], digest=digest,
                                  records=staged and staged["records"], labels=staged and staged["labels"],
                                  step=lambda n, total: progress.report(f"abandon {digest[:12]}", n, total))
        store.upsert("ingests", pl.DataFrame([{**journal, "state": "abandoned", "finished_at": datetime.now(UTC)}],
                                             schema=schema.INGESTS.schema))
    shutil.rmtree(directory, ignore_errors=True)
    return done


def refusal(store: Store) -> str | None:
    """Why recalibration must wait (an ingest cut off between commits) and both ways out, or None."""
    cut = store.read("ingests", state="writing").sort("started_at")
    if cut.height == 0:
        return None
    row = cut.row(0, named=True)
    short, db = row["digest"][:12], store.path
    staged = _staged_manifest(store, row["digest"]) is not None
    complete = (f"complete it — `cic ingest --complete {short} --db {db}` (from its staged data, no file needed) or "
                f"rerun `cic ingest {row['file']} --db {db}`" if staged else
                f"complete it — its staged data is gone, so rerun `cic ingest {row['file']} --db {db}` (the same "
                "bytes, any name)")
    return (f"the ingest of {row['file']!r} (id {short}) was cut off before its last commit ({cut.height} unfinished "
            f"in {db}); {complete} — or undo what it stored with `cic ingest --abandon {short} --db {db}`; then "
            "recalibrate")


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks: what the ingest journal knows a file by."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unfinished_ingests(store: Store) -> list[str]:
    """Files whose ingest was cut off between commits (a kill, a full disk): rerunning it completes it."""
    return unfinished_ingest_files(store)
