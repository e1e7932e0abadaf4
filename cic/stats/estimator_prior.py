"""Shares of delta for choosing an estimator among K, from how the estimators did on *other* data.

`choose_estimator` (and `estimator: auto`) certifies each of K estimators at its own share of delta and keeps the
one answering the most; the union bound needs only that the shares sum to at most delta and are fixed before this
calibration set's labels are read. Split equally, twelve estimators at n = 300 each get delta / 12 and little
certifies. A **prior** — one number per estimator, larger meaning better, measured on data independent of this
calibration set (past runs of the same model on other datasets, an earlier window of questions not in this one) —
lets most of delta go where it will likely be used: the best-ranked estimators get `PRIOR_SHARES` of delta in rank
order, the others share the rest equally (so a wrong prior costs power, never validity). Why these numbers:
docs/statistics.md, "A prior for the estimator choice".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cic.errors import UserError

#: Under a prior, the shares of delta of the best-ranked estimator and the next; the others share the rest equally
#: (measured against the best first alone at 0.9: a past ranking often swaps the two best — docs/statistics.md).
PRIOR_SHARES = (0.7, 0.2)


def uniform_shares(names: Sequence[str], delta: float) -> dict[str, float]:
    """delta / K each: the choice without a prior."""
    return {name: delta / len(names) for name in names}


def prior_shares(names: Sequence[str], prior: Mapping[str, float] | None, delta: float,
                 ranked: Sequence[float] = PRIOR_SHARES) -> dict[str, float]:
    """Each estimator's share of delta (summing to delta): uniform without a prior (None or empty); with one, the
    estimators in order of their prior value (larger first, `names` order on a tie) get `ranked` of delta — 0.7 and
    0.2 — and the rest share what is left equally; with K <= len(ranked) the first K are scaled to sum to 1. An
    estimator the prior does not name ranks below every one it names."""
    if not names:
        raise UserError("prior_shares needs at least one estimator")
    if not prior:
        return uniform_shares(names, delta)
    values = {name: float(value) for name, value in prior.items()}
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise UserError(f"prior: {bad!r}: each value must be a finite number (larger = better on other data)")
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise UserError(f"prior names {unknown[0]!r}, not one of the estimators {list(names)}")
    if not all(r > 0 for r in ranked) or sum(ranked) > 1 + 1e-12:
        raise UserError(f"prior shares = {tuple(ranked)!r}: each positive, summing to at most 1")
    order = sorted(names, key=lambda n: (n not in values, -values.get(n, 0.0), names.index(n)))
    k, top = len(names), list(ranked[:len(names)])
    if k <= len(ranked):
        parts = [r / sum(top) for r in top]
    elif sum(top) >= 1:
        raise UserError(f"prior shares = {tuple(ranked)!r} leave nothing for the other {k - len(top)} estimators")
    else:
        parts = top + [(1 - sum(top)) / (k - len(top))] * (k - len(top))
    return {name: part * delta for name, part in zip(order, parts, strict=True)}


def checked_shares(names: Sequence[str], shares: Mapping[str, float], delta: float) -> dict[str, float]:
    """A caller's own shares: one per estimator, each positive, summing to at most delta (else the union bound
    would not hold)."""
    missing = [n for n in names if n not in shares]
    extra = sorted(set(shares) - set(names))
    if missing or extra:
        raise UserError(f"shares: give one per estimator ({list(names)}); "
                        + (f"missing {missing[0]!r}" if missing else f"unknown {extra[0]!r}"))
    values = {n: float(shares[n]) for n in names}
    if not all(v > 0 and math.isfinite(v) for v in values.values()):
        raise UserError(f"shares = {values!r}: each must be a positive number")
    total = sum(values.values())
    if total > delta * (1 + 1e-12):
        raise UserError(f"shares sum to {total:.6g} > delta = {delta:g}: the union bound needs at most delta")
    return values
