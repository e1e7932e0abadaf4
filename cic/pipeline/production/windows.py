"""Which new labelled pairs a recalibration uses (the window rule), and one drift check of a pass: shared by the
single gates' recalibration and the system gates' (`cic.pipeline.production.system_recalibration`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from cic.errors import UserError
from cic.pipeline.alerts import (
    BECAME_UNATTAINABLE,
    LIVE_RELABELLED,
    LIVE_REPLACED,
    RELABELLED,
    REPLACED,
    UNATTAINABLE,
    Alert,
    kind_of,
    test_kind,
)
from cic.pipeline.gates.gate_rows import ColumnReader
from cic.pipeline.run.durations import parse_duration
from cic.pipeline.run.stored_calibration import settled, span  # noqa: F401 - re-exported: a window's cut and span
from cic.stats.drift import DriftTest

MIN_WINDOW = 2


@dataclass(frozen=True)
class WindowRule:
    """Which new labelled pairs to use: the newest `count`, those seen within `since` of `now`, or both."""

    count: int | None = None
    since: timedelta | None = None
    now: datetime | None = None

    def __post_init__(self) -> None:
        if self.count is not None and (isinstance(self.count, bool) or self.count < MIN_WINDOW):
            raise UserError(f"window = {self.count!r}: must be at least {MIN_WINDOW} labelled questions")
        if self.since is not None and self.since <= timedelta(0):
            raise UserError(f"since = {self.since!r}: must be a positive duration")

    def describe(self) -> str:
        parts = [f"newest {self.count}" if self.count else "", f"seen within {self.since}" if self.since else ""]
        return " and ".join(p for p in parts if p) or "all new"


def parse_since(text: str | None) -> timedelta | None:
    """'7d', '12h', '30m', '2w' → a timedelta (None stays None)."""
    return parse_duration(text, "since")


@dataclass
class Check:
    """One drift test, the candidates it concerns, and whether Holm rejected it across the pass."""

    test: DriftTest
    gate_ids: list[str]
    rejected: bool = False
    live_gate_id: str | None = None  # the live gate whose threshold an error-rate test checks

    def alert(self) -> Alert:
        """The alert its rejection raises, of the kind its test names."""
        return Alert(test_kind(self.test.name), self.test.detail)

    def candidate_alert(self) -> Alert:
        """The alert a candidate of the tested slot carries: the test's, naming the live gate whose threshold an
        error-rate test checked (the candidate waits for a person because of it, not because of its own
        threshold)."""
        alert = self.alert()
        return alert if self.live_gate_id is None else Alert(alert.kind, f"live gate {self.live_gate_id[:12]}: {alert}")


def new_window(pairs: pl.DataFrame, after: datetime | None, rule: WindowRule) -> pl.DataFrame:
    """Pairs strictly after `after` (the reference's end), narrowed by the rule."""
    chosen = pairs if after is None else pairs.filter(pl.col("at") > after)
    if rule.since is not None:
        chosen = chosen.filter(pl.col("at") >= (rule.now or datetime.now(UTC)) - rule.since)
    if rule.count is not None and chosen.height > rule.count:
        chosen = chosen.tail(rule.count)
    return chosen


def too_few(count: int, since: str, rule: WindowRule, waiting: int) -> str:
    """Why a key (single or system) gets no candidate: its new window's size, from where, under which rule, and the
    records still within the label window."""
    wait = f"; {waiting} more wait for their label window to close" if waiting else ""
    return (f"{count} new labelled question(s){since} under rule '{rule.describe()}'; at least {MIN_WINDOW} are "
            f"needed{wait}")


def changed_under(live: ColumnReader | None) -> list[Alert]:
    """The pages a candidate carries when the gate speaking for its key (single or system) had its own data changed
    under it (`cic ingest --relabel` / `--replace` flagged it)."""
    if live is None:
        return []
    paged = {RELABELLED: LIVE_RELABELLED, REPLACED: LIVE_REPLACED}
    return [Alert(paged[kind_of(a)], f"live gate {live['calibration_id'][:12]}: {a}")
            for a in live["alerts"] if kind_of(a) in paged]


def unattainable_alert(was_reached: bool, n_cal: int, why: str | None = None) -> Alert:
    """Alpha unattainable on a new window: a page when the gate speaking for the key reached it, else a warning;
    `why`: the window's limits (`cic.stats.limits.window_limits`), said after it."""
    because = f"; {why}" if why else ""
    if was_reached:
        return Alert(BECAME_UNATTAINABLE, "alpha has become unattainable: the new gate would abstain on "
                                          f"everything{because}")
    return Alert(UNATTAINABLE, f"alpha is unattainable on the new window ({n_cal} labelled questions): the gate "
                               f"would abstain on everything{because}")
