"""Gates for a system with one family-wise guarantee: a cascade of models, and the estimator chosen from several.

**Cascade.** Models M_1 … M_k in cost order answer the same questions, each with its uncertainty score. With
thresholds (lambda_1 … lambda_k) the system answers with the first model whose score is within its threshold
and abstains when none is. Its risk is R(lambda) = P(the answering model is wrong | some model answers). The
threshold space is searched along label-free paths: with F_i the empirical CDF of M_i's calibration scores and a
weight w_i per model, the path q -> lambda(q) sets lambda_i(q) to the largest calibration score of M_i with
F_i <= w_i·q. Along a path the answered set only grows with q, so the path is one ordered family of hypotheses
H_q: R(lambda(q)) > alpha, each tested on the calibration questions the system answers at q (their count n(q)
and the answering models' errors FD(q)) exactly as a single model's thresholds are, by any search of
`cic.stats.searches` (the default: `fallback`). Several paths share delta equally (a union bound) and the one
with the most coverage (or the least cost at a coverage floor) is returned. The guarantee: with probability
>= 1 - delta over the calibration draw, the returned thresholds have system risk <= alpha, conditionally on
every model's calibration scores (the paths, like a single model's candidates, depend on the scores only),
assuming calibration and future questions are exchangeable and each model's answers are fixed by the question
(what the store holds). Not covered: a model whose behaviour changes after calibration (the monitor's job).

**Estimator choice.** Picking the best of K gates certified at delta each on the same data can be wrong with
probability up to K·delta. `choose_estimator` certifies each estimator at delta / K and returns the one with the
most coverage: P(the chosen gate has risk > alpha) <= P(some estimator's gate has) <= delta.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats._validation import checked
from cic.stats.searches import DEFAULT_SEARCH, Setting, get_search, run_search

#: Label-free paths through the threshold space: per model, the weight of its score quantile (model i answers
#: at level q when F_i(u_i) <= w_i·q; weight 0: it never answers, so each model alone is a path too). More
#: models than weights repeat the last weight.
DEFAULT_PATHS: tuple[tuple[float, ...], ...] = ((1.0, 0.0), (0.0, 1.0), (0.25, 1.0), (0.5, 1.0), (1.0, 1.0),
                                                (1.0, 0.5))


@dataclass(frozen=True)
class CascadeResult:
    """A certified cascade: per model its threshold (None: it never answers), and what the system does on the
    calibration questions at those thresholds."""

    models: tuple[str, ...]
    thresholds: tuple[float | None, ...]
    alpha: float
    delta: float
    bound: str
    search: str
    path: tuple[float, ...]
    n_calibration: int
    n_accepted: int
    n_errors: int
    bound_value: float
    shares: tuple[float, ...]  # share of calibration questions each model answers
    cost_per_question: float | None
    candidates: int
    guarantee: str = field(repr=False, default="")

    @property
    def certified(self) -> bool:
        return any(t is not None for t in self.thresholds)

    @property
    def coverage(self) -> float:
        return self.n_accepted / self.n_calibration if self.n_calibration else 0.0

    def route(self, scores: Sequence[float | None]) -> int | None:
        """The index of the model that answers a question with these scores (None: abstain); a score left None
        is one not asked for yet — call models in order and stop at the first that answers."""
        for i, (t, u) in enumerate(zip(self.thresholds, scores, strict=True)):
            if t is not None and u is not None and u <= t:
                return i
        return None

    def summary(self) -> str:
        if not self.certified:
            return (f"alpha = {self.alpha:g} is unattainable for the cascade {' -> '.join(self.models)} at delta = "
                    f"{self.delta:g} ({self.n_calibration} calibration questions): abstain on everything")
        parts = ", ".join(f"{m} when score <= {t:.6g}" if t is not None else f"{m} never"
                          for m, t in zip(self.models, self.thresholds, strict=True))
        shares = ", ".join(f"{m} {s:.0%}" for m, s in zip(self.models, self.shares, strict=True))
        cost = "" if self.cost_per_question is None else f"; cost {self.cost_per_question:.4g} per question"
        return (f"answer with {parts}: system error among answered <= {self.alpha:g} with probability >= "
                f"{1 - self.delta:g} ({_bounds.get_bound(self.bound).label} UCB {self.bound_value:.4f} at n = "
                f"{self.n_accepted}, FD = {self.n_errors}); answers {self.coverage:.0%} ({shares}){cost}")


def cascade_counts(scores: Sequence[np.ndarray], errors: Sequence[np.ndarray],
                   path: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Along one path: the candidate levels q (ascending), the questions answered n(q) and the answering models'
    errors FD(q). A question enters at the smallest q at which some model's s_i = F_i(u_i) / w_i <= q, and each
    later model-change (an earlier, cheaper model taking over) is an event that swaps its error."""
    n = scores[0].shape[0]
    level = np.stack([_ecdf(u) / w if w > 0 else np.full(n, np.inf)
                      for u, w in zip(scores, path, strict=True)])  # (k, n); a weight of 0 never answers
    err = np.stack([np.asarray(e, dtype=np.int64) for e in errors])
    order = np.argsort(level, axis=0, kind="stable")  # per question, models by the level they enter at
    event_q, event_dn, event_dfd = [], [], []
    current = np.full(n, level.shape[0])  # index of the answering model (k: none yet)
    for step in range(level.shape[0]):
        model = order[step]
        takes_over = model < current
        rows = np.flatnonzero(takes_over)
        was = current[rows]
        new_err = err[model[rows], rows]
        old_err = np.where(was < level.shape[0], err[np.minimum(was, level.shape[0] - 1), rows], 0)
        event_q.append(level[model[rows], rows])
        event_dn.append((was == level.shape[0]).astype(np.int64))
        event_dfd.append(new_err - old_err)
        current[rows] = model[rows]
    q = np.concatenate(event_q)
    sort = np.argsort(q, kind="stable")
    q, dn, dfd = q[sort], np.concatenate(event_dn)[sort], np.concatenate(event_dfd)[sort]
    finite = np.isfinite(q)  # a model of weight 0 enters at infinity: never
    q, dn, dfd = q[finite], dn[finite], dfd[finite]
    last = np.flatnonzero(np.append(q[1:] != q[:-1], True))
    return q[last], np.cumsum(dn)[last], np.cumsum(dfd)[last]


def _ecdf(u: np.ndarray) -> np.ndarray:
    """F(u_j) = #{i: u_i <= u_j} / n on the calibration scores themselves (ties share a value)."""
    s = np.sort(u)
    return np.searchsorted(s, u, side="right") / u.shape[0]


def _thresholds(scores: Sequence[np.ndarray], path: Sequence[float], q: float) -> tuple[float | None, ...]:
    """lambda_i(q): the largest calibration score of model i whose level F_i / w_i is <= q (None: none is)."""
    out: list[float | None] = []
    for u, w in zip(scores, path, strict=True):
        inside = u[_ecdf(u) <= w * q]
        out.append(float(inside.max()) if inside.size else None)
    return tuple(out)


@checked
def calibrate_cascade(scores: Sequence[Any], errors: Sequence[Any], *, alpha: float, delta: float = 0.05,
                      bound: str = "cp", search: str = DEFAULT_SEARCH, models: Sequence[str] | None = None,
                      costs: Sequence[float] | None = None, paths: Sequence[Sequence[float]] = DEFAULT_PATHS,
                      min_coverage: float | None = None) -> CascadeResult:
    """Certify a cascade of models (cost order) on the same calibration questions.

    `scores[i]`, `errors[i]`: model i's uncertainty and 0/1 error on question j (aligned by question). Each path
    is searched at delta / len(paths); the result is the certified path with the most coverage, or, with
    `min_coverage`, the cheapest (by `costs`: model i's cost per call, every model up to the answering one
    called) among those answering at least that share.
    """
    us = [np.asarray(u, dtype=float) for u in scores]
    es = [np.asarray(e) for e in errors]
    _check_cascade(us, es, models, costs)
    names = tuple(models) if models is not None else tuple(f"model{i + 1}" for i in range(len(us)))
    bound = _bounds.resolve_bound(bound)
    plan = get_search(search)
    n = us[0].shape[0]
    per_path = delta / len(paths)
    found = []
    for raw in paths:
        path = tuple(float(w) for w in raw) + (float(raw[-1]),) * max(0, len(us) - len(raw))
        values, accepted, wrong = cascade_counts(us, es, path[:len(us)])
        outcome = run_search(plan, values, accepted, wrong, setting=Setting(n, bound, float(alpha)),
                             delta=per_path, lazy=True)
        index = int(outcome.index[0])
        found.append(_result(us, es, names, costs, path[:len(us)], values, accepted, wrong, index,
                             float(outcome.level[0]), alpha, delta, bound, plan.name))
    return _pick(found, min_coverage)


def _check_cascade(us: list[np.ndarray], es: list[np.ndarray], models: Sequence[str] | None,
                   costs: Sequence[float] | None) -> None:
    if len(us) < 2 or len(us) != len(es):
        raise UserError(f"a cascade needs scores and errors for at least two models (got {len(us)} score and "
                        f"{len(es)} error columns)")
    n = us[0].shape[0]
    for i, (u, e) in enumerate(zip(us, es, strict=True)):
        if u.shape != (n,) or e.shape != (n,):
            raise UserError(f"model {i + 1}: scores and errors must be 1-D and cover the same {n} questions")
        if not np.isfinite(u).all():
            raise UserError(f"model {i + 1}: scores must be finite")
        if not np.isin(e, (0, 1)).all():
            raise UserError(f"model {i + 1}: errors must be 0 or 1")
    for name, given in (("models", models), ("costs", costs)):
        if given is not None and len(given) != len(us):
            raise UserError(f"{name} = {list(given)!r}: one per model ({len(us)})")
    if costs is not None and not all(math.isfinite(c) and c >= 0 for c in costs):
        raise UserError(f"costs = {list(costs)!r}: must be finite and >= 0")


def _result(us: list[np.ndarray], es: list[np.ndarray], names: tuple[str, ...], costs: Sequence[float] | None,
            path: tuple[float, ...], values: np.ndarray, accepted: np.ndarray, wrong: np.ndarray, index: int,
            gamma: float, alpha: float, delta: float, bound: str, search: str) -> CascadeResult:
    n = us[0].shape[0]
    if index < 0:
        thresholds: tuple[float | None, ...] = (None,) * len(us)
        n_acc, fd, value = 0, 0, math.nan
    else:
        thresholds = _thresholds(us, path, float(values[index]))
        n_acc, fd = int(accepted[index]), int(wrong[index])
        value = float(_bounds.ucb(bound, fd, n_acc, gamma))
    answering = answering_model(us, thresholds)
    shares = tuple(float(np.mean(answering == i)) for i in range(len(us)))
    cost = None
    if costs is not None:  # a model with a threshold is called when every model before it declined
        undecided, total = np.ones(n, dtype=bool), 0.0
        for i, c in enumerate(costs):
            if thresholds[i] is not None:
                total += c * float(undecided.mean())
                undecided &= answering != i
        cost = total
    guarantee = (f"P(system error among answered <= {alpha:g}) >= {1 - delta:g}: {len(us)}-model cascade, "
                 f"thresholds along label-free paths of score quantiles searched by {search} at delta / paths "
                 "(union over paths); conditional on every model's calibration scores, exchangeable questions")
    return CascadeResult(names, thresholds, float(alpha), float(delta), bound, search, path, n, n_acc, fd, value,
                         shares, cost, int(values.shape[0]), guarantee)


def answering_model(us: Sequence[np.ndarray], thresholds: Sequence[float | None]) -> np.ndarray:
    """Per question, the index of the model that answers at these thresholds (len(us): none does) — what
    `CascadeResult.route` decides one question at a time."""
    out = np.full(us[0].shape[0], len(us))
    for i in range(len(us) - 1, -1, -1):
        t = thresholds[i]
        if t is not None:
            out = np.where(us[i] <= t, i, out)
    return out


def _pick(found: list[CascadeResult], min_coverage: float | None) -> CascadeResult:
    certified = [r for r in found if r.certified]
    if not certified:
        return found[0]
    if min_coverage is not None:
        enough = [r for r in certified if r.coverage >= min_coverage and r.cost_per_question is not None]
        if enough:
            return min(enough, key=lambda r: (r.cost_per_question, -r.coverage))
    return max(certified, key=lambda r: r.n_accepted)


@dataclass(frozen=True)
class EstimatorChoice:
    """The estimator whose gate answers the most, each estimator certified at delta / K."""

    estimator: str | None
    result: Any  # the chosen CalibrationResult (None when no estimator certifies anything)
    results: Mapping[str, Any]
    delta: float
    guarantee: str


def choose_estimator(tables: Mapping[str, tuple[Any, Any]], *, alpha: float, delta: float = 0.05,
                     bound: str = "cp", search: str = DEFAULT_SEARCH) -> EstimatorChoice:
    """Certify every estimator's (scores, errors) at delta / K and choose the one accepting the most calibration
    answers: the chosen gate has risk <= alpha with probability >= 1 - delta (union bound over the K)."""
    from cic.stats.calibration import calibrate

    if not tables:
        raise UserError("choose_estimator needs at least one estimator's (scores, errors)")
    share = delta / len(tables)
    results = {name: calibrate(s, e, alpha=alpha, delta=share, bound=bound, search=search, keep_table=False)
               for name, (s, e) in tables.items()}
    certified = {k: r for k, r in results.items() if r.threshold is not None}
    name = max(certified, key=lambda k: certified[k].n_accepted) if certified else None
    guarantee = (f"P(the chosen gate's error among accepted <= {alpha:g}) >= {1 - delta:g}: each of {len(tables)} "
                 f"estimators certified at delta / {len(tables)} = {share:.4g}, the largest coverage chosen")
    return EstimatorChoice(name, certified.get(name) if name else None, results, float(delta), guarantee)
