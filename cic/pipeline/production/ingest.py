"""Production records in: questions a deployed model answered, its uncertainty scores, and correctness labels
that often arrive later — stored next to the pipeline's own runs so recalibration can use them.

A file (Parquet, CSV or JSONL) holds one record a row:

| column | meaning |
|---|---|
| `model`, `stream` | the model that answered and the traffic stream (stored as the dataset name) |
| `question_id` | the record's id within the model's stream (re-sending it unchanged changes nothing) |
| `question`, `answer`, `timestamp` | what was asked, what the model answered, when (windows by time use it) |
| `score:<estimator>` | one column per uncertainty score, e.g. `score:semantic_entropy` (higher = less sure) |
| `correct` | optional: true/false (1/0), stored under the criterion named by `label_name` (default `human`) |
| `correct:<name>` | optional, one per labeller: true/false (1/0) stored under criterion `<name>` |
| `gold` | optional: the right answer, labelled with a named criterion (`exact_match`, `token_f1[0.5]`, ...) |
| the column `group` names | optional: the record's group (user segment, tier); stored in stream `<stream>/<group>` |

A judge on every record and people on a few: `correct:judge` and `correct:human` (empty where nobody labelled),
then `cic calibrate STORE --judge-col judge --human-col human` certifies with both (`cic.calibrate_judged`).

Grouped records get gates of their own per group, certified at once with `calibration.group_by: dataset`.

A record keeps its group: one whose (model, question_id) is stored in another group of its stream (or, without
`group`, in a group of it) is refused, as are two groups for one record in a file; group values may not
contain '/'.

A file of `model`, `stream`, `question_id` and `correct` (or `gold`) alone labels records ingested earlier.

History stays append-only and checked: a timestamp needs a time zone (or `timezone` names the one naive times are
in) and may not lie beyond now + `max_skew` or before 2000; a label that would change a stored label is refused
unless `relabel`, and then recorded in `label_events` and flagged on every gate whose window held the record; a
re-sent record whose question, answer, timestamp, gold or any score differs from the stored one is refused unless
`replace`, and then recorded in `record_events` (old and new value) and flagged the same way. Records are keyed by
(model, stream, question_id): two models' questions never overwrite each other.

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

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.production.ingest_changes import Changes, Stage, checked_labels, checked_records, record_changes
from cic.pipeline.production.ingest_options import (
    BATCH_ROWS,
    COMMIT_RECORDS,
    DEFAULT_OPTIONS,
    KEY_COLUMNS,
    LABEL_PREFIX,
    MEMORY_LIMIT,
    PROMPT_ID,
    RECORD_COLUMNS,
    SCORE_PREFIX,
    SPLIT,
    IngestOptions,
    IngestStats,
    estimator_name,
    labeller_name,
    run_key_of,
)
from cic.pipeline.production.ingest_records import (
    Batch,
    Checks,
    bool_column,
    optional_text,
    score_column,
    text_column,
    time_column,
)
from cic.pipeline.production.record_batches import SUFFIXES, record_batches
from cic.pipeline.run.score_names import ingest_notes
from cic.store.ingest_queries import (
    first_group_clash,
    first_group_move,
    first_question_in_two_groups,
    first_repeated_key,
    new_record_count,
    staged_label_count,
    staged_streams,
    stored_answers,
)

if TYPE_CHECKING:
    from cic.store import Store

from cic.pipeline.production import ingest_journal
from cic.pipeline.production.ingest_journal import (
    abandon_ingest,
    complete_ingest,
    file_digest,
    find_ingest,
    refusal,
    staging_dir,
    unfinished_ingests,
)

__all__ = ["IngestOptions", "IngestStats", "abandon_ingest", "complete_ingest", "file_digest", "find_ingest",
           "ingest_file", "refusal", "run_key_of", "staging_dir", "unfinished_ingests"]


@dataclass(frozen=True)
class Layout:
    """What the file holds, decided from its columns: score columns (column → estimator), labels-only or not."""

    columns: tuple[str, ...]
    scores: dict[str, str]
    labels_only: bool
    group: str | None = None
    labellers: dict[str, str] = field(default_factory=dict)  # `correct:<name>` column -> criterion <name>

    @classmethod
    def of(cls, columns: list[str], source: str, group: str | None = None) -> Layout:
        if group is not None:
            if group in (*KEY_COLUMNS, *RECORD_COLUMNS, "correct", "gold") or group.startswith(
                    (SCORE_PREFIX, LABEL_PREFIX)):
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
        labellers = _labellers([c for c in columns if c.startswith(LABEL_PREFIX)], source)
        labels_only = not raw_scores and not any(c in columns for c in RECORD_COLUMNS)
        known = {*KEY_COLUMNS, *RECORD_COLUMNS, "correct", "gold", *raw_scores, *labellers, *([group] if group else [])}
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise UserError(f"{source}: unknown column(s) {', '.join(map(repr, unknown))}; columns are model, stream, "
                             f"question_id, question, answer, timestamp, {SCORE_PREFIX}<estimator>, correct, "
                             f"{LABEL_PREFIX}<labeller>, gold")
        if labels_only and "correct" not in columns and "gold" not in columns and not labellers:
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
        return cls(tuple(columns), scores, labels_only, group, labellers)

    def conform(self, frame: pl.DataFrame, first: int, source: str) -> pl.DataFrame:
        """A batch with exactly the file's columns (a JSONL line may omit a key: null)."""
        extra = [c for c in frame.columns if c not in self.columns]
        if extra:
            raise UserError(f"{source}: column(s) {', '.join(map(repr, extra))} first appear at or after record "
                             f"{first}; give every record the same fields")
        missing = [c for c in self.columns if c not in frame.columns]
        return frame.with_columns(pl.lit(None).alias(c) for c in missing).select(self.columns)


def ingest_file(store: Store, path: str | Path, options: IngestOptions = DEFAULT_OPTIONS, *, embedder: Any = None,
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
    journal = ingest_journal.journal_entry(store, digest)
    if journal is not None and journal["state"] == "writing":  # a cut-off ingest of these bytes: complete it
        if ingest_journal.staged_manifest(store, digest) is not None:
            return complete_ingest(store, digest, file=p, relabel=relabel, replace=options.replace)
        checks = Checks(now=checks.now, max_skew=max_skew, timezone=timezone, stamp=journal["started_at"])
    stats = IngestStats(file=str(path))
    with store.scratch("ingest") as tmp, \
            store.memory_limit(MEMORY_LIMIT):
        stage = Stage(Path(tmp))
        layout = None
        for first, frame in record_batches(p, batch_rows):
            if layout is None:
                layout = Layout.of(frame.columns, source, group)
                if "gold" in layout.columns and criterion is None:
                    raise UserError(f"{source} has a gold column: name the criterion that labels answers against "
                                     "it (--criterion exact_match, token_f1[0.5], similarity[0.6])")
                if criterion is not None and "gold" not in layout.columns:
                    raise UserError(f"criterion = {criterion!r}: {source} has no gold column to label against")
                if "correct" in layout.columns and label_name in layout.labellers.values():
                    raise UserError(f"{source}: columns 'correct' (label name {label_name!r}) and "
                                    f"'{LABEL_PREFIX}{label_name}' label under one name; keep one")
            batch = Batch(layout.conform(frame, first, source), first, source)
            embedder = _stage_batch(store, stage, batch, layout, checks, label_name, criterion, embedder)
            stats.records += 0 if layout.labels_only else batch.frame.height
        if layout is None:
            raise UserError(f"file = {str(p)!r}: has no records")
        _check_unique(store, stage, source)
        _check_groups(store, stage, source)
        if not layout.labels_only:
            stats.new = new_record_count(store, stage.files["keys"])
            stats.notes = ingest_notes(layout.scores.values())
        changed = checked_labels(store, stage.files["labels"], source, relabel)
        replaced = None if layout.labels_only else checked_records(store, stage.files["records"],
                                                                   stage.files["scores"], source, options.replace)
        _write(store, stage, layout, p, checks.stamp or checks.now, Changes(changed, replaced), stats,
               experiment_prefix, commit_files=max(1, commit_records // batch_rows), digest=digest)
    return stats


def _labellers(columns: list[str], source: str) -> dict[str, str]:
    """`correct:<name>` column -> criterion <name>, each named once."""
    out: dict[str, str] = {}
    for column in columns:
        name = labeller_name(column)
        if not name:
            raise UserError(f"{source}: column {column!r} names no labeller (e.g. {LABEL_PREFIX}judge)")
        if name.startswith(RESERVED_CRITERIA):
            raise UserError(f"{source}: column {column!r}: {name!r} is a criterion's name; give the labeller a name "
                            "of its own (judge, human, ...)")
        if schema.JUDGED_JOIN in name:
            raise UserError(f"{source}: column {column!r}: {schema.JUDGED_JOIN!r} joins a judge's criterion and "
                            "the people's (calibration.judged); name the labeller without it")
        if name in out.values():
            raise UserError(f"{source}: two columns name labeller {name!r} (names are compared without spaces); "
                            "keep one")
        out[column] = name
    return out


RESERVED_CRITERIA = ("option_match", "similarity", "exact_match", "token_f1")


def _checked_options(label_name: str, criterion: str | None, timezone: str | None, max_skew: timedelta) -> str | None:
    if not label_name.strip() or label_name.startswith(RESERVED_CRITERIA):
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


def _stage_batch(store: Store, stage: Stage, batch: Batch, layout: Layout, checks: Checks, label_name: str,
                 criterion: str | None, embedder: Any) -> Any:
    """Check one batch field by field and stage its rows; returns the embedder (made once, when needed)."""
    models, streams, qids = (text_column(batch, c) for c in KEY_COLUMNS)
    bases = streams
    if layout.group is not None:
        groups = text_column(batch, layout.group)
        batch.fail(groups.str.contains("/", literal=True), lambda r: f"{layout.group} = {groups[r]!r}: a group may "
                   "not contain '/' (the record is stored in stream '<stream>/<group>')")
        streams = (streams + "/" + groups).alias("stream")
    pairs = pl.DataFrame({"model": models, "stream": streams}).unique()
    keys_of = {(m, s): run_key_of(m, s) for m, s in pairs.iter_rows()}
    run_keys = pl.Series("run_key", [keys_of[(m, s)] for m, s in zip(models, streams, strict=True)])
    record = pl.int_range(batch.first, batch.first + batch.frame.height, dtype=pl.Int64, eager=True).alias("record")
    keys = pl.DataFrame({"run_key": run_keys, "model": models, "stream": streams, "question_id": qids,
                         "record": record, "base": bases})
    correct = bool_column(batch, "correct") if "correct" in layout.columns else None
    gold = optional_text(batch, "gold") if "gold" in layout.columns else None
    if layout.labels_only:
        stored = stored_answers(store, stage.add("keys", keys))
        missing = stored.get_column("text").is_null()
        batch.fail(missing, lambda r: f"no ingested record of model {models[r]!r}, stream {streams[r]!r} has this "
                                      "question_id; ingest the record (question, answer, timestamp, scores) first"
                                      " (records ingested with --group COL are in stream '<stream>/<group>': "
                                      "label them with --group COL too)")
        answers = stored.get_column("text")
    else:
        questions = text_column(batch, "question")
        answers = text_column(batch, "answer", allow_empty=True)
        observed = time_column(batch, checks)
        scores = {name: score_column(batch, column) for column, name in layout.scores.items()}
        stage.add("keys", keys)
        stage.add("records", keys.with_columns(question=questions, answer=answers, observed_at=observed,
                                               gold=gold if gold is not None else pl.lit(None, dtype=pl.String)))
        stage.add("scores", pl.concat([pl.DataFrame({"run_key": run_keys, "question_id": qids, "estimator": name,
                                                     "value": values}, schema=schema.SCORES.schema)
                                       for name, values in scores.items()]))
    labels = []
    for name, verdicts in ((label_name, correct), *((n, bool_column(batch, c)) for c, n in layout.labellers.items())):
        if verdicts is None:
            continue
        given = verdicts.is_not_null()
        labels.append(keys.filter(given).with_columns(criterion=pl.lit(name), aligned=verdicts.filter(given),
                                                      value=verdicts.filter(given).cast(pl.Float64)))
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


def _check_unique(store: Store, stage: Stage, source: str) -> None:
    """No (model, stream, question_id) twice in the file (checked in DuckDB over every staged batch)."""
    repeated = first_repeated_key(store, stage.files["keys"])
    if repeated:
        model, stream, qid, records = repeated
        raise UserError(f"{source}: records {', '.join(map(str, records))} repeat model {model!r}, stream "
                         f"{stream!r}, question_id {qid!r}")


def _check_groups(store: Store, stage: Stage, source: str) -> None:
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


def _write(store: Store, stage: Stage, layout: Layout, path: Path, now: datetime, changes: Changes,
           stats: IngestStats, experiment_prefix: str, commit_files: int, digest: str) -> None:
    """Everything staged: runs, questions (per model), answers, scores,
    times, labels, and for a relabelling its events and the gates it flags. Up to `commit_files` staged batches
    of each kind go in one transaction; a larger file commits in steps under its `ingests` journal entry
    ('writing' until the last step; recalibration waits for it and rerunning the ingest completes it)."""
    pairs = staged_streams(store, stage.files["keys"])
    steps = [(kind, files[i:i + commit_files]) for kind in ("records", "scores", "labels")
             for files in [stage.files[kind]] for i in range(0, len(files), commit_files)]
    plan = ingest_journal.commit_plan(steps)
    previous = ingest_journal.journal_entry(store, digest)
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
        steps = ingest_journal.persist_staged(store, digest, path, now, steps, stats, committed=first)
    with store.transaction():
        store.upsert("runs", pl.DataFrame({
            "run_key": [run_key_of(m, s) for m, s, _ in pairs], "model": [m for m, _, _ in pairs],
            "dataset": [s for _, s, _ in pairs], "split": SPLIT, "prompt_id": PROMPT_ID,
            "generation_config": [schema.canonical_json({"source": "ingest"} if s == b else {  # the key is the same
                "source": "ingest", "stream": b, "group_column": layout.group}) for _, s, b in pairs],
            "created_at": None, "experiment_prefix": experiment_prefix, "unanswered": None,
            "moved_requests": None},
            schema=schema.RUNS.schema))  # every (model, stream) at once
        stats.runs.extend({"model": m, "stream": s, "run_key": run_key_of(m, s)} for m, s, _ in pairs)
        record_changes(store, stage, changes, path.name, now, stats)
        if not journaled:  # one step per kind: all at once
            for kind, files in steps:
                ingest_journal.write_step(store, kind, files, path, now, digest)
            steps = []
        store.upsert("ingests", pl.DataFrame([{**journal, "state": "writing" if steps else "done",
                                               "finished_at": None if steps else now}],
                                             schema=schema.INGESTS.schema))
    if steps:  # a large file: one commit per step, the journal says it is unfinished
        ingest_journal.commit_steps(store, digest, steps, first, path.name, now)
