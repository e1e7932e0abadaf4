"""The three threshold searches run on many calibration sets at once (one row each).

The split protocol and the Monte-Carlo simulator both reduce to: per row, candidate thresholds in ascending
order with counts n and FD. Feasibility of every (n, FD) pair is one gather from the `max_errors` table of the
bound, so no row is ever calibrated in a Python loop. Row results match `cic.calibrate` exactly (tested).
"""

from __future__ import annotations

import numpy as np

from cic.stats import bounds as _bounds


def feasibility(bound: str, fd: np.ndarray, n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    """Boolean matrix: the bound certifies alpha at (fd, n), via the per-n maximum feasible FD."""
    kmax = _bounds.max_errors(bound, np.arange(int(n.max(initial=0)) + 1), alpha, gamma)
    return fd <= kmax[n]


def last_true(mask: np.ndarray) -> np.ndarray:
    """Per row, the index of the last True column, or -1."""
    idx = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), idx, -1)


def select(feasible: np.ndarray, eligible: np.ndarray, search: str) -> np.ndarray:
    """Per row, the chosen candidate column (-1 = no threshold).

    paper / bonferroni: the largest eligible feasible candidate. fixed_sequence: eligible candidates are
    tested in column order and testing stops at the first failure; the last one that passed is chosen.
    """
    if search in ("paper", "bonferroni"):
        return last_true(feasible & eligible)
    if search != "fixed_sequence":
        raise ValueError(f"search = {search!r}: unknown")
    failed = eligible & ~feasible
    first_fail = np.where(failed.any(axis=1), np.argmax(failed, axis=1), feasible.shape[1])
    before = np.arange(feasible.shape[1])[None, :] < first_fail[:, None]
    return last_true(eligible & before)
