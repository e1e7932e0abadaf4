"""What an ingest is told and what it reports: `IngestOptions` (declared once, passed from the command through
the flow and its task), `IngestStats`, and the constants and names every part of the ingest shares."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from cic import schema
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX

if TYPE_CHECKING:
    pass


SCORE_PREFIX = "score:"
LABEL_PREFIX = "correct:"  # `correct:<labeller>`: one labeller's verdicts (a judge's, people's), stored as criterion
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
    labels a `gold` column, whether labels (`relabel`) and stored records (`replace`) may change, the clock skew
    allowed (5m, 1h), the zone of timestamps written without one, the experiment prefix of the streams' runs, and
    the column holding each record's group."""

    label_name: str = "human"
    criterion: str | None = None
    relabel: bool = False
    replace: bool = False
    max_skew: str = "5m"
    timezone: str | None = None
    experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX
    group: str | None = None

    def skew(self, option: str = "max_skew") -> timedelta:
        """`max_skew` as a duration (an absurd or negative one refused, naming `option`)."""
        from cic.pipeline.run.durations import parse_duration

        return parse_duration(self.max_skew, option)


@dataclass
class IngestStats:
    """What one file added: records (new or re-sent), labels, relabelled labels and replaced records, the gates
    they flagged,
    and the runs (model, stream) they belong to."""

    file: str
    records: int = 0
    labels: int = 0
    unlabelled: int = 0
    relabelled: int = 0
    replaced: int = 0  # stored records re-sent with another value in some field (`replace`), recorded
    flagged_gates: list[str] = field(default_factory=list)
    runs: list[dict[str, str]] = field(default_factory=list)
    new: int | None = None  # records the store did not hold before (None: a file of labels alone)
    notes: list[str] = field(default_factory=list)  # score names `cic ask` cannot compute (`score_names`)


DEFAULT_OPTIONS = IngestOptions()


def run_key_of(model: str, stream: str) -> str:
    """The run key of a (model, stream): what every ingest of that pair writes under."""
    return schema.run_key(model, stream, SPLIT, PROMPT_ID, {"source": "ingest"})


def labeller_name(column: str) -> str:
    """The criterion a `correct:` column is stored under, whitespace removed (`correct: judge` → judge)."""
    return re.sub(r"\s+", "", column[len(LABEL_PREFIX):])


def estimator_name(column: str) -> str:
    """The estimator a `score:` column names, whitespace removed (`score: semantic_entropy ` → semantic_entropy)."""
    return re.sub(r"\s+", "", column[len(SCORE_PREFIX):])
