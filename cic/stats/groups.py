"""Guarantees per group: one threshold per group (traffic stream, dataset category, user segment), each
certified ≤ alpha, all of them at once with probability ≥ 1 − delta.

A gate certified on the pooled data controls the error rate averaged over the mix; a group with a higher error
rate can sit above alpha while the pool is below it. `calibrate_groups` calibrates each of the G groups on its
own data at delta / G (Bonferroni over groups): the chance that any group's certificate fails is at most
G × delta / G = delta, whatever the dependence between groups, so with probability ≥ 1 − delta every group's
error rate among its accepted answers is ≤ alpha at once. A group too small to certify anything is reported
unattainable with its size. `pooled_fallback` gives such a group the pooled gate instead, labelled as carrying
no per-group guarantee.

`group_validity` is the evidence: repeated calibrations on a simulated mix where one group is worse than the
pool, each gate judged by its true error rate; the share of repetitions in which some group's rate exceeds
alpha, per-group versus pooled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats._validation import as_pair, checked
from cic.stats.calibration import CalibrationResult, calibrate
from cic.stats.searches import DEFAULT_SEARCH, Search

GUARANTEE = ("with probability >= 1 - delta, every group's error rate among its accepted answers is <= alpha "
             "at once (each group certified at delta / G, Bonferroni over the G groups)")


@dataclass(frozen=True)
class GroupGate:
    """One group's outcome: its size, its certified result (at delta / G), and the gate it serves."""

    group: str
    size: int
    result: CalibrationResult
    served: str  # "group" (its own certificate), "pooled" (fallback, no per-group guarantee), "none"

    @property
    def threshold(self) -> float | None:
        return self.result.threshold


@dataclass(frozen=True)
class GroupCalibration:
    """Per-group gates with a simultaneous guarantee, and the pooled gate (at delta) beside them."""

    groups: tuple[GroupGate, ...]
    pooled: CalibrationResult
    alpha: float
    delta: float
    guarantee: str = GUARANTEE

    def threshold_of(self, group: str) -> float | None:
        """The threshold a group is served (None: abstain on all of it; an unknown group: the pooled gate's,
        which carries no per-group guarantee)."""
        for gate in self.groups:
            if gate.group == group:
                return gate.threshold if gate.served == "group" else (
                    self.pooled.threshold if gate.served == "pooled" else None)
        return self.pooled.threshold

    def as_rows(self) -> list[dict[str, Any]]:
        """One plain row per group: what a table or a JSON file holds."""
        return [{"group": g.group, "size": g.size, "served": g.served, "threshold": self.threshold_of(g.group),
                 "certified_threshold": g.threshold, "n_accepted": g.result.n_accepted,
                 "n_errors": g.result.n_errors, "bound_value": g.result.bound_value, "gamma": g.result.gamma}
                for g in self.groups]


@checked
def calibrate_groups(scores: Any, errors: Any, groups: Any, *, alpha: float, delta: float = 0.05,
                     bound: str = "cp", search: str | Search = DEFAULT_SEARCH, pooled_fallback: bool = False,
                     **search_args: Any) -> GroupCalibration:
    """Per-group thresholds, each certified ≤ alpha at delta / G (see the module docstring)."""
    values, wrong = as_pair(scores, errors)
    labels = np.asarray(groups)
    if labels.shape != values.shape:
        raise UserError(f"groups has {labels.size} entries for {values.size} scores; give one group per item")
    names = sorted({str(g) for g in labels.tolist()})
    if not names:
        raise UserError("groups is empty: nothing to calibrate")
    as_text = labels.astype(str)
    share = delta / len(names)
    gates = []
    for name in names:
        mask = as_text == name
        result = calibrate(values[mask], wrong[mask], alpha=alpha, delta=share, bound=bound, search=search,
                           keep_table=False, **search_args)
        served = "group" if result.feasible else ("pooled" if pooled_fallback else "none")
        gates.append(GroupGate(name, int(mask.sum()), result, served))
    pooled = calibrate(values, wrong, alpha=alpha, delta=delta, bound=bound, search=search, keep_table=False,
                       **search_args)
    return GroupCalibration(tuple(gates), pooled, alpha, delta)


@checked
def group_validity(*, alpha: float = 0.25, delta: float = 0.1, sizes: tuple[int, ...] = (3000, 3000, 1500),
                   worse: int = 2, excess: float = 0.1, repetitions: int = 500, seed: int = 0,
                   bound: str = "cp", search: str | Search = DEFAULT_SEARCH) -> dict[str, float]:
    """Simulated mix of groups: scores U ~ Uniform(0, 1), P(error | U = u) = 0.05 + 0.6 u, plus `excess` in
    group `worse`; so a threshold t has true error rate 0.05 + 0.3 t (+ excess) among the answers it accepts.
    Each repetition draws a calibration set of every group, calibrates per group and pooled, and checks each
    group's true error rate at the threshold it is served. Returns the share of repetitions in which some
    group's rate exceeds alpha — per-group (guaranteed ≤ delta) and pooled — and the worse group's coverage."""
    rng = np.random.default_rng(seed)
    per_group_fail = pooled_fail = 0
    coverage_group: list[float] = []
    coverage_pooled: list[float] = []

    def true_rate(threshold: float | None, g: int) -> float:
        if threshold is None or threshold <= 0:
            return 0.0  # abstains on everything: no answer is wrong
        return 0.05 + 0.3 * min(threshold, 1.0) + (excess if g == worse else 0.0)

    labels = np.concatenate([np.full(n, str(g)) for g, n in enumerate(sizes)])
    for _ in range(repetitions):
        u = rng.random(labels.size)
        rate = 0.05 + 0.6 * u + np.where(labels == str(worse), excess, 0.0)
        wrong = (rng.random(labels.size) < rate).astype(np.int8)
        fitted = calibrate_groups(u, wrong, labels, alpha=alpha, delta=delta, bound=bound, search=search)
        served = [fitted.threshold_of(str(g)) for g in range(len(sizes))]
        per_group_fail += any(true_rate(t, g) > alpha for g, t in enumerate(served))
        pooled_fail += any(true_rate(fitted.pooled.threshold, g) > alpha for g in range(len(sizes)))
        coverage_group.append(min(served[worse] or 0.0, 1.0))
        coverage_pooled.append(min(fitted.pooled.threshold or 0.0, 1.0))
    return {"per_group_violation": per_group_fail / repetitions, "pooled_violation": pooled_fail / repetitions,
            "worse_group_coverage_per_group": float(np.mean(coverage_group)),
            "worse_group_coverage_pooled": float(np.mean(coverage_pooled)), "repetitions": repetitions,
            "delta": delta, "alpha": alpha}


@checked
def evaluate_group_splits(scores: Any, errors: Any, groups: Any, *, alphas: tuple[float, ...] = (0.1, 0.2),
                          delta: float = 0.05, bound: str = "cp", search: str | Search = DEFAULT_SEARCH,
                          n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                          pooled_fallback: bool = False, **search_args: Any) -> list[dict[str, Any]]:
    """The split protocol per group: over `n_splits` random calibration/test splits, per-group gates
    (`calibrate_groups`) and the pooled gate are fitted on the calibration part and judged on each group's test
    part. One row per (alpha, group, gate): test FDR mean (splits where the group was served a threshold that
    accepted something), the share of those above alpha, coverage mean (accepted / the group's test size; 0 when
    it abstains), fails (splits where the group was served nothing) — the per-group FDR/coverage table."""
    values, wrong = as_pair(scores, errors)
    labels = np.asarray(groups).astype(str)
    if labels.shape != values.shape:
        raise UserError(f"groups has {labels.size} entries for {values.size} scores; give one group per item")
    names = sorted(set(labels.tolist()))
    rng = np.random.default_rng(seed)
    outcomes: dict[tuple[float, str, str], list[tuple[float | None, float]]] = {}
    for _ in range(n_splits):
        order = rng.permutation(values.size)
        cut = int(round(cal_fraction * values.size))
        cal, test = order[:cut], order[cut:]
        for alpha in alphas:
            fitted = calibrate_groups(values[cal], wrong[cal], labels[cal], alpha=alpha, delta=delta, bound=bound,
                                      search=search, pooled_fallback=pooled_fallback, **search_args)
            for name in names:
                mask = labels[test] == name
                u, e = values[test][mask], wrong[test][mask]
                for gate, threshold in (("per_group", fitted.threshold_of(name)), ("pooled", fitted.pooled.threshold)):
                    accepted = u <= threshold if threshold is not None else np.zeros(u.size, dtype=bool)
                    fdr = float(e[accepted].mean()) if accepted.any() else None
                    coverage = float(accepted.mean()) if u.size else 0.0
                    outcomes.setdefault((alpha, name, gate), []).append((fdr, coverage))
    rows = []
    for (alpha, name, gate), results in outcomes.items():
        fdrs = [f for f, _ in results if f is not None]
        rows.append({"alpha": alpha, "group": name, "gate": gate, "size": int((labels == name).sum()),
                     "fdr_mean": float(np.mean(fdrs)) if fdrs else None,
                     "fdr_above_alpha": float(np.mean([f > alpha for f in fdrs])) if fdrs else None,
                     "coverage_mean": float(np.mean([c for _, c in results])),
                     "fails": sum(f is None for f, _ in results), "n_splits": n_splits})
    return sorted(rows, key=lambda r: (r["alpha"], r["group"], r["gate"]))
