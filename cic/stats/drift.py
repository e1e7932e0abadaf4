"""What changed between two calibrations of the same key: threshold, coverage, and the score distribution.

The guarantee assumes calibration and deployment data are exchangeable. A recalibration therefore compares
the new labelled window with the previous one: a two-sample Kolmogorov–Smirnov test on the scores warns
when the distribution has moved (the old certificate may no longer describe current traffic).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cic.stats._validation import as_scores, check_open_unit


@dataclass(frozen=True)
class DriftReport:
    """Old vs new threshold and coverage on the new window, with the shift test on the scores."""

    previous_threshold: float | None
    threshold: float | None
    threshold_change: float | None
    coverage_previous_threshold: float   # share of the new window the old gate would answer
    coverage: float                      # share of the new window the new gate answers
    coverage_change: float
    ks_statistic: float
    ks_p_value: float
    shift_detected: bool
    alpha_unattainable: bool
    became_unattainable: bool

    def warnings(self) -> list[str]:
        """Human-readable alerts, loudest first."""
        out = []
        if self.became_unattainable:
            out.append("alpha has become unattainable: the new gate abstains on everything")
        elif self.alpha_unattainable:
            out.append("alpha is unattainable on the new window: the gate abstains on everything")
        if self.shift_detected:
            out.append(f"score distribution shifted (KS = {self.ks_statistic:.3f}, p = {self.ks_p_value:.2g}): "
                       "exchangeability with the previous window is doubtful")
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coverage(scores: np.ndarray, threshold: float | None) -> float:
    return float((scores <= threshold).mean()) if threshold is not None else 0.0


def compare_calibrations(previous_scores: Any, new_scores: Any, *, previous_threshold: float | None,
                         threshold: float | None, shift_p_value: float = 0.01) -> DriftReport:
    """Compare a new calibration with the previous one of the same (model, dataset, estimator, ..., alpha) key."""
    from scipy.stats import ks_2samp

    old = as_scores(previous_scores, "previous_scores")
    new = as_scores(new_scores, "new_scores")
    level = check_open_unit(shift_p_value, "shift_p_value")
    test = ks_2samp(old, new)
    cov_old, cov_new = _coverage(new, previous_threshold), _coverage(new, threshold)
    change = (threshold - previous_threshold) if threshold is not None and previous_threshold is not None else None
    return DriftReport(
        previous_threshold=previous_threshold, threshold=threshold, threshold_change=change,
        coverage_previous_threshold=cov_old, coverage=cov_new, coverage_change=cov_new - cov_old,
        ks_statistic=float(test.statistic), ks_p_value=float(test.pvalue),
        shift_detected=bool(test.pvalue < level), alpha_unattainable=threshold is None,
        became_unattainable=threshold is None and previous_threshold is not None,
    )
