"""What a recalibration alert is: a typed value (`Alert`: its kind and its sentence) made where the test is made,
and the one-line headline every surface (the flow run's state message, the console, the artifact, MLflow) shows.

A kind (`AlertKind`, one entry of `ALERT_KINDS`) carries its severity and the withdrawal rule; nothing reads an
alert's words to decide anything. A *page* fails the nightly run: something that changes what is served or whether
its guarantee still holds (drift at a live threshold, a monitor alarm, labels changed under a live gate, an alpha a
live gate reached that the new window cannot, labels missing in a share above the limit). A *warning* completes it
with a note: a configured alpha this data never reaches, a candidate's own relabel, candidates held for a person
(family over delta), records whose label window closed without a label. Adding a kind is one
`ALERT_KINDS.register(AlertKind(...))` (or a `cic.alerts` entry point); a drift test's kind names the test
(`AlertKind.test`), the test itself is a `cic.stats.drift.DriftRule` in `DRIFT_TESTS` (group `cic.drift_tests`)
that every recalibration pass runs, and the pass's MLflow run logs every kind's count (`AlertKind.metric`) and each
drift test's statistic and p-value with no edit elsewhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cic.registry import Registry

PAGE, WARNING = "page", "warning"


@dataclass(frozen=True)
class AlertKind:
    """One kind of alert: its name (what tables count), severity, rank (0 most severe: a summary shows the worst
    first), the withdrawal rule (`withdraws`: a live gate whose test raises it stops serving), the drift test whose
    rejection raises it (`test`: `cic.stats.drift.DriftTest.name`; None: raised otherwise) and its MLflow metric: a
    recalibration run logs `metric` (how many alerts of the kind it raised) and, for a test's kind, the test's
    `<test>_statistic` and smallest `<test>_p_value`."""

    name: str
    severity: str
    rank: int
    withdraws: bool = False
    test: str | None = None

    @property
    def metric(self) -> str:
        """`alerts_<name in snake case>`: the MLflow metric counting this kind (MLflow keys: letters, digits, _)."""
        return "alerts_" + "_".join("".join(c if c.isalnum() else " " for c in self.name.lower()).split())

    def __reduce__(self) -> tuple[Any, ...]:  # unpickles as the registered kind of its name (Ray, Prefect)
        return _kind, (self.name, self.severity, self.rank, self.withdraws, self.test)


ALERT_KINDS: Registry[AlertKind] = Registry("alert kind", (
    ERROR_RATE := AlertKind("error rate above alpha", PAGE, 0, withdraws=True, test="error_rate"),
    MONITOR_ALARM := AlertKind("monitor alarm", PAGE, 1, withdraws=True),
    LIVE_RELABELLED := AlertKind("labels changed under the live gate", PAGE, 2),
    BECAME_UNATTAINABLE := AlertKind("alpha became unattainable", PAGE, 3),
    SCORE_SHIFT := AlertKind("score shift", PAGE, 4, test="score_shift"),
    STATE_BROKEN := AlertKind("certificate state cannot be replayed", PAGE, 5, withdraws=True),
    LIVE_REPLACED := AlertKind("records replaced under the live gate", PAGE, 6),
    MISSING_LABELS := AlertKind("labels missing above the limit", PAGE, 7, withdraws=True),
    RELABELLED := AlertKind("labels changed under this gate", WARNING, 10),
    OVER_BUDGET := AlertKind("family over delta", WARNING, 11),
    UNLABELLED := AlertKind("labels missing past the label window", WARNING, 12),
    LATE_LABELS := AlertKind("labels arrived after their window", WARNING, 13),
    UNCERTIFIED := AlertKind("alpha still uncertified", WARNING, 14),
    UNATTAINABLE := AlertKind("alpha unattainable", WARNING, 15),
    REPLACED := AlertKind("records replaced under this gate", WARNING, 16),
    # an alert stored before kinds were stored: it pages (an alert of unknown kind is never silenced)
    UNCLASSIFIED := AlertKind("unclassified", PAGE, 99),
), base=AlertKind, group="cic.alerts")



def _kind(name: str, severity: str, rank: int, withdraws: bool, test: str | None = None) -> AlertKind:
    made = AlertKind(name, severity, rank, withdraws, test)
    known = ALERT_KINDS.find(name)
    return known if known == made else made


def test_kind(test: str) -> AlertKind:
    """The kind of alert a drift test's rejection raises (`AlertKind.test`; a test no kind names pages as
    `UNCLASSIFIED`: never silenced)."""
    return next((k for k in ALERT_KINDS.values() if k.test == test), UNCLASSIFIED)


class Alert(str):
    """An alert's sentence with its kind attached: it reads, joins and stores as the sentence, and every decision
    reads `kind` (a plain str — an alert stored before kinds were — is `UNCLASSIFIED`)."""

    kind: AlertKind

    def __new__(cls, kind: AlertKind, text: str) -> Alert:
        out = super().__new__(cls, text)
        out.kind = kind
        return out

    def __getnewargs__(self) -> tuple[Any, ...]:  # type: ignore[override]  # pickles with its kind (Ray, Prefect)
        return self.kind, str(self)


def kind_of(alert: str) -> AlertKind:
    """An alert's kind; a sentence without one (read from an old store) is `UNCLASSIFIED`."""
    return getattr(alert, "kind", UNCLASSIFIED)


def stored(texts: Sequence[str] | None, kinds: Sequence[str | None] | None) -> tuple[Alert, ...]:
    """Alerts read back from the gate event log: each sentence with the kind stored beside it."""
    names = list(kinds or [])
    out = []
    for i, text in enumerate(texts or []):
        name = names[i] if i < len(names) else None
        out.append(Alert(ALERT_KINDS.find(name) or UNCLASSIFIED, text))
    return tuple(out)


def kind_names(alerts: Iterable[str]) -> list[str]:
    """The kinds of alerts to store beside their sentences (`gate_events.alert_kinds`)."""
    return [kind_of(a).name for a in alerts]


def severity(alert: str) -> str:
    """PAGE or WARNING."""
    return kind_of(alert).severity


def withdraws(alert: str) -> bool:
    """Whether a live gate whose test raised this alert stops serving (the withdrawal rule)."""
    return kind_of(alert).withdraws


def counts_by_kind(alerts: Iterable[str]) -> list[tuple[str, int]]:
    """(kind, count) in severity order: the same counts on every surface."""
    counted = Counter(kind_of(a) for a in alerts)
    return [(kind.name, n) for kind, n in sorted(counted.items(), key=lambda item: item[0].rank)]


def counts_line(alerts: Iterable[str]) -> str:
    """'error rate above alpha × 1, alpha unattainable × 8'."""
    return ", ".join(f"{kind} × {n}" for kind, n in counts_by_kind(alerts))


def headline(alerts: Sequence[tuple[str, str]]) -> str:
    """The most severe of (place label, alert) alerts alone, then the rest counted by kind in one line: what a
    page's first line must say."""
    ordered = sorted(alerts, key=lambda a: kind_of(a[1]).rank)
    label, text = ordered[0]
    line = f"{severity(text).upper()} {label}: {text}"
    if len(ordered) > 1:
        line += f" — {len(ordered) - 1} more: {counts_line(t for _, t in ordered[1:])}"
    return line
