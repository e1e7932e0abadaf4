"""Durations as people write them ('7d', '12h', '30m', '2w', '45s'), for windows and clock skews; below the
config and recalibration, so both can use it."""

from __future__ import annotations

from datetime import timedelta

from cic.errors import UserError

UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
LONGEST = timedelta(days=365 * 100)


def parse_duration(text: str | None, name: str = "since") -> timedelta | None:
    """'7d' → timedelta(days=7) (None stays None); a bad or absurd duration is one error naming `name`."""
    if text is None:
        return None
    value, unit = str(text).strip()[:-1], str(text).strip()[-1:].lower()
    try:
        amount = float(value)
    except ValueError:
        amount = -1.0
    if unit not in UNITS or not amount > 0:
        raise UserError(f"{name} = {text!r}: expected a positive number and a unit s, m, h, d or w (e.g. 7d)")
    try:
        duration = timedelta(**{UNITS[unit]: amount})
    except OverflowError:
        duration = timedelta.max
    if duration > LONGEST:
        raise UserError(f"{name} = {text!r}: longer than 100 years; give a duration such as 7d or 12h")
    return duration
