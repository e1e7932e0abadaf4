"""How well a score ranks errors: the risk–coverage curve, the prediction rejection ratio (PRR), the area under
the accuracy–rejection curve (AUARC) and, for a score that is one minus a probability, the expected calibration
error (ECE) — what harness users read.

All are descriptive (no guarantee): they tell a user which uncertainty estimator leaves the fewest errors
among the answers it keeps, i.e. which one lets the certified threshold accept the most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats._validation import as_pair
from cic.stats.calibration import SortedCalibration


@dataclass(frozen=True)
class RiskCoverage:
    """At each distinct score t (ascending): coverage n(t)/N and selective risk FD(t)/n(t) of `score <= t`."""

    thresholds: np.ndarray
    coverage: np.ndarray
    risk: np.ndarray

    def at(self, threshold: float) -> tuple[float, float]:
        """(coverage, risk) of the rule `score <= threshold`; (0, 0) when it accepts nothing."""
        i = int(np.searchsorted(self.thresholds, threshold, side="right")) - 1
        return (0.0, 0.0) if i < 0 else (float(self.coverage[i]), float(self.risk[i]))


def risk_coverage_curve(scores: Any, errors: Any) -> RiskCoverage:
    """The empirical risk–coverage curve of accepting answers whose score is at most t (ties accepted together)."""
    s, e = as_pair(scores, errors)
    thresholds, n, fd = SortedCalibration.build(s, e).unique_candidates()
    return RiskCoverage(thresholds, n / s.shape[0], fd / n)


@dataclass(frozen=True)
class RejectionCurve:
    """Error rate among the kept answers after rejecting the fraction `rejected` of the most uncertain ones."""

    rejected: np.ndarray  # k / N for k = 0 .. N - 1
    uncertainty: np.ndarray  # rejecting by the score (expected value over random order within ties)
    oracle: np.ndarray  # rejecting the errors first
    random: float  # rejecting at random: the base error rate at every k
    prr: float | None  # None when every answer is right or every answer is wrong (the ratio is 0 / 0)

    @property
    def auarc(self) -> float:
        """Area under the accuracy–rejection curve: the accuracy of the kept answers averaged over the rejection
        rates k / N (1 − the uncertainty curve's area; the oracle's is the most any score reaches)."""
        return 1.0 - float(self.uncertainty.mean())


def rejection_curve(scores: Any, errors: Any) -> RejectionCurve:
    """The prediction rejection curve and its ratio (PRR), as in LM-Polygraph (Fadeeva et al. 2023).

    With N answers, W of them wrong, reject the k most uncertain (k = 0 .. N - 1) and take the error rate of
    the N - k kept: err_unc(k). Within tied scores the order is random, so err_unc uses the expected number
    of errors kept (linear within a tie). The oracle rejects errors first: err_orc(k) = max(W - k, 0)/(N - k);
    random rejection keeps err_rnd(k) = W / N. With AUC(x) = (1/N) Σ_k x(k) (a uniform grid of rejection
    rates),

        PRR = (AUC_rnd - AUC_unc) / (AUC_rnd - AUC_orc),

    1 for a score that ranks every error above every correct answer, 0 for a score no better than random,
    negative when it ranks errors as the most confident.
    """
    s, e = as_pair(scores, errors)
    n_items = s.shape[0]
    _, n, fd = SortedCalibration.build(s, e).unique_candidates()
    counts, errs = np.concatenate([[0], n]), np.concatenate([[0], fd])
    kept = np.arange(n_items, 0, -1, dtype=np.float64)  # N - k for k = 0 .. N - 1
    wrong = float(e.sum())
    unc = np.interp(kept, counts, errs) / kept
    oracle = np.maximum(wrong - np.arange(n_items), 0.0) / kept
    base = wrong / n_items
    auc_unc, auc_orc = float(unc.mean()), float(oracle.mean())
    prr = (base - auc_unc) / (base - auc_orc) if base - auc_orc > 0 else None
    return RejectionCurve(np.arange(n_items) / n_items, unc, oracle, base, prr)


def prediction_rejection_ratio(scores: Any, errors: Any) -> float | None:
    """PRR of `scores` as an error detector (see `rejection_curve`); None when all answers agree."""
    return rejection_curve(scores, errors).prr


#: Bins of the expected calibration error: 15 equal-width bins of confidence (Guo et al. 2017's choice).
ECE_BINS = 15
PROBABILITY_PREFIX = "one_minus_"  # estimators scoring 1 - a probability: their confidence is 1 - score


def expected_calibration_error(confidence: Any, correct: Any, bins: int = ECE_BINS) -> float:
    """ECE = Σ_b |B_b| / N · |accuracy(B_b) − mean confidence(B_b)| over equal-width confidence bins in [0, 1]
    (the last bin closed): 0 for a confidence that is the probability of being right."""
    c, right = as_pair(confidence, correct)
    if ((c < 0) | (c > 1)).any():
        raise UserError("confidence must lie in [0, 1] for the calibration error")
    which = np.minimum((c * bins).astype(np.int64), bins - 1)
    size = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, weights=right, minlength=bins) - np.bincount(which, weights=c, minlength=bins))
    return float(gap.sum() / size.sum())


def confidence_of(estimator: str, scores: Any) -> np.ndarray | None:
    """The confidence an estimator's scores state, 1 − score, where the score is one minus a probability (its
    name starts with `one_minus_` and every score lies in [0, 1]); None for other scores, which have no
    calibration error to measure (an entropy is not a probability)."""
    s = np.asarray(scores, dtype=np.float64)
    if not estimator.split("[", 1)[0].startswith(PROBABILITY_PREFIX) or ((s < 0) | (s > 1)).any():
        return None
    return 1.0 - s
