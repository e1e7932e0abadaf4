"""Has traffic moved since the live gate was certified? Two tests on a new labelled window, corrected together.

The guarantee assumes calibration and deployment data are exchangeable. A recalibration compares the newest
window — disjoint from the data the live gate was calibrated on — with that data:

- `score_shift_test`: two-sample Kolmogorov–Smirnov on the uncertainty scores (once per model, dataset and
  estimator: the scores do not depend on alpha, bound or criterion);
- `error_rate_test`: among new questions the live gate would answer, is the error rate above the alpha it
  certifies? One-sided exact binomial test, H0: rate ≤ alpha.

A recalibration runs many of them (models × datasets × estimators, and every live gate): `holm` controls the
family-wise error across all of them, so a quiet week raises an alarm with probability ≤ the level.

Every test a recalibration runs is an entry of `DRIFT_TESTS` (entry-point group `cic.drift_tests`): a new one is a
`DriftRule` — on the scores or on the questions a live gate answers — and the alert kind naming it
(`cic.pipeline.alerts.AlertKind.test`); single gates and cascades run it, Holm counts it, MLflow logs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.registry import Registry
from cic.stats._validation import as_errors, as_scores, check_open_unit


@dataclass(frozen=True)
class DriftTest:
    """One test on the new window: what it measured, its p-value, and a sentence saying so."""

    name: str            # "score_shift" or "error_rate"
    statistic: float     # KS distance, or the error rate among answered questions
    p_value: float
    n_reference: int     # questions in the live gate's window (score shift) / 0
    n: int               # new questions compared (score shift) / answered by the live gate (error rate)
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_shift_test(reference_scores: Any, new_scores: Any) -> DriftTest:
    """Two-sample KS test: do the new window's scores follow the reference window's distribution?"""
    from scipy.stats import ks_2samp

    before = as_scores(reference_scores, "reference_scores")
    after = as_scores(new_scores, "new_scores")
    test = ks_2samp(before, after)
    return DriftTest("score_shift", float(test.statistic), float(test.pvalue), before.size, after.size,
                     f"score distribution moved since the live gate's window (KS = {test.statistic:.3f}, "
                     f"n = {before.size} vs {after.size}, p = {test.pvalue:.2g})")


def error_rate_test(scores: Any, errors: Any, *, threshold: float, alpha: float) -> DriftTest:
    """Among the new questions with score ≤ threshold (those the live gate answers), is the error rate above
    alpha? p = P(Binomial(n, alpha) ≥ errors); 1 when the gate would answer none of them."""
    values = as_scores(scores, "scores")
    wrong = as_errors(errors, "errors")
    if values.size != wrong.size:
        raise UserError(f"scores and errors differ in length ({values.size} vs {wrong.size})")
    return answered_error_test(values <= threshold, wrong, alpha=alpha,
                               where=f"at the live threshold {threshold:.4g}")


def answered_error_test(accepted: Any, errors: Any, *, alpha: float, where: str) -> DriftTest:
    """`error_rate_test` on questions already marked answered (a cascade answers by several thresholds): among
    them, is the error rate above alpha? `where` names the gate's thresholds in the sentence."""
    from scipy.stats import binom

    level = check_open_unit(alpha, "alpha")
    chosen = np.asarray(accepted, dtype=bool)
    n, k = int(chosen.sum()), int(np.asarray(errors)[chosen].sum())
    p = float(binom.sf(k - 1, n, level)) if n else 1.0
    rate = k / n if n else 0.0
    return DriftTest("error_rate", rate, min(p, 1.0), 0, n,
                     f"error rate {where} is {k}/{n} = {rate:.3f} on the new window, above the certified "
                     f"alpha = {level:g} (binomial p = {p:.2g})")


def holm(p_values: Any, level: float) -> np.ndarray:
    """Holm's step-down rejections (True = reject) at family-wise level `level`: the i-th smallest p-value is
    compared with level / (m - i), stopping at the first that is not below it."""
    p = np.asarray(p_values, dtype=float).reshape(-1)
    check_open_unit(level, "level")
    if np.isnan(p).any():
        raise ValueError("p_values contain NaN")
    order = np.argsort(p, kind="stable")
    m = p.size
    rejected = np.zeros(m, dtype=bool)
    for rank, index in enumerate(order):
        if p[index] > level / (m - rank):
            break
        rejected[index] = True
    return rejected


ON_SCORES, ON_ANSWERED = "scores", "answered"


@dataclass(frozen=True)
class DriftRule:
    """One test every recalibration runs. `on = "scores"`: `run(reference_scores, new_scores)`, once per model,
    dataset and estimator (per stage of a cascade); `on = "answered"`: `run(answered, errors, alpha=, where=)`, once
    per live gate on the new window's labelled questions (`answered`: those the gate answers; `where`: its
    thresholds, for the sentence). `run` returns a `DriftTest`; its rejection raises the alert kind whose `test` is
    this rule's name."""

    name: str
    on: str
    run: Callable[..., DriftTest]

    def __post_init__(self) -> None:
        if self.on not in (ON_SCORES, ON_ANSWERED):
            raise UserError(f"drift test {self.name!r}: on = {self.on!r}; use {ON_SCORES!r} or {ON_ANSWERED!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> DriftTest:
        """The rule's test, named after the rule (the alert kind and the MLflow metrics are found by it)."""
        test = self.run(*args, **kwargs)
        if not isinstance(test, DriftTest):
            raise UserError(f"drift test {self.name!r} returned {type(test).__name__}, not a DriftTest")
        return test if test.name == self.name else replace(test, name=self.name)


DRIFT_TESTS: Registry[DriftRule] = Registry("drift test", (
    DriftRule("score_shift", ON_SCORES, score_shift_test),
    DriftRule("error_rate", ON_ANSWERED, answered_error_test),
), base=DriftRule, group="cic.drift_tests")


def drift_rules(on: str) -> list[DriftRule]:
    """The registered tests on `on` ("scores" or "answered"), built-in ones first."""
    return [rule for rule in DRIFT_TESTS.values() if rule.on == on]
