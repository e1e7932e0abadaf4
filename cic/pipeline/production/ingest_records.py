"""One batch of an ingested file, parsed and checked column by column: texts, scores, labels and timestamps,
each bad value refused naming its record (1 = the first of the file), its field and its value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import polars as pl

from cic.errors import UserError
from cic.pipeline.production.ingest_options import EARLIEST, FALSE_WORDS, MAX_SKEW, TRUE_WORDS

if TYPE_CHECKING:
    pass



@dataclass(frozen=True)
class Checks:
    """How records are judged: the clock (`now`), the allowed skew, the zone of naive timestamps."""

    now: datetime
    max_skew: timedelta = MAX_SKEW
    timezone: str | None = None
    stamp: datetime | None = None  # what rows are stamped with: a rerun of a cut-off ingest keeps its first one


class Batch:
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


def _as_text(batch: Batch, name: str) -> pl.Series:
    """A column as text: strings and integers are; any other value is an error naming its record."""
    column = batch.frame.get_column(name)
    if column.dtype != pl.String and not column.dtype.is_integer() and column.dtype != pl.Null:
        batch.fail(column.is_not_null(), lambda r: f"{name} = {batch.value(name, r)!r}: expected text")
    return column.cast(pl.String)


def text_column(batch: Batch, name: str, *, allow_empty: bool = False) -> pl.Series:
    text = _as_text(batch, name)
    batch.fail(text.is_null(), lambda r: f"{name} is missing")
    if not allow_empty:
        batch.fail(text.str.strip_chars() == "", lambda r: f"{name} is empty")
    return text


def optional_text(batch: Batch, name: str) -> pl.Series:
    """Text that may be absent: null or blank is None."""
    text = _as_text(batch, name)
    return text.set((text.str.strip_chars() == "").fill_null(False), None)  # type: ignore[arg-type]


def score_column(batch: Batch, name: str) -> pl.Series:
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


def bool_column(batch: Batch, name: str) -> pl.Series:
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


def time_column(batch: Batch, checks: Checks) -> pl.Series:
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
