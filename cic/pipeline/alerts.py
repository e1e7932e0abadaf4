"""What a recalibration alert is: its kind and severity, read once from its sentence, and the one-line headline
every surface (the flow run's state message, the console, the artifact, MLflow) shows.

A *page* fails the nightly run: something that changes what is served or whether its guarantee still holds
(drift at a live threshold, a monitor alarm, labels changed under a live gate, an alpha a live gate reached
that the new window cannot). A *warning* completes it with a note: a configured alpha this data never reaches,
a candidate's own relabel, candidates held for a person (family over delta).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

PAGE, WARNING = "page", "warning"

#: (sentence prefix, kind, severity), most severe first: a summary shows the worst alert first
ALERT_KINDS = (("error rate at the live threshold", "error rate above alpha", PAGE),
               ("anytime-valid monitor", "monitor alarm", PAGE),
               ("live gate", "labels changed under the live gate", PAGE),
               ("alpha has become unattainable", "alpha became unattainable", PAGE),
               ("score distribution moved", "score shift", PAGE),
               ("labels changed", "labels changed under this gate", WARNING),
               ("family over budget", "family over delta", WARNING),
               ("alpha is unattainable", "alpha unattainable", WARNING))


def alert_kind(text: str) -> tuple[int, str]:
    """(severity rank, kind) of an alert's sentence: 0 is the most severe; an unknown sentence ranks last."""
    for rank, (prefix, kind, _) in enumerate(ALERT_KINDS):
        if text.startswith(prefix):
            return rank, kind
    return len(ALERT_KINDS), "other"


def severity(text: str) -> str:
    """PAGE or WARNING; a sentence of no known kind pages (an unknown alert is not silenced)."""
    for prefix, _, level in ALERT_KINDS:
        if text.startswith(prefix):
            return level
    return PAGE


def counts_by_kind(texts: Iterable[str]) -> list[tuple[str, int]]:
    """(kind, count) in severity order: the same counts on every surface."""
    counted = Counter(alert_kind(t) for t in texts)
    return [(kind, n) for (_, kind), n in sorted(counted.items())]


def counts_line(texts: Iterable[str]) -> str:
    """'error rate above alpha × 1, alpha unattainable × 8'."""
    return ", ".join(f"{kind} × {n}" for kind, n in counts_by_kind(texts))


def headline(alerts: Sequence[tuple[str, str]]) -> str:
    """The most severe of (place label, sentence) alerts alone, then the rest counted by kind in one line:
    what a page's first line must say."""
    ordered = sorted(alerts, key=lambda a: alert_kind(a[1])[0])
    label, text = ordered[0]
    line = f"{severity(text).upper()} {label}: {text}"
    if len(ordered) > 1:
        line += f" — {len(ordered) - 1} more: {counts_line(t for _, t in ordered[1:])}"
    return line
