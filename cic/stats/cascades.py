"""Gates for a system with one family-wise guarantee: a cascade of models, and the estimator chosen from several.

**Cascade.** Models M_1 … M_k in cost order answer the same questions, each with its uncertainty score. With
thresholds (lambda_1 … lambda_k) the system answers with the first model whose score is within its threshold
and abstains when none is. Its risk is R(lambda) = P(the answering model is wrong | some model answers). The
threshold space is searched along label-free paths: with F_i the empirical CDF of M_i's calibration scores and a
weight w_i per model, the path q -> lambda(q) sets lambda_i(q) to the largest calibration score of M_i with
F_i <= w_i·q. Along a path the answered set only grows with q, so the path is one ordered family of hypotheses
H_q: R(lambda(q)) > alpha, each tested on the calibration questions the system answers at q (their count n(q)
and the answering models' errors FD(q)) exactly as a single model's thresholds are, by any search of
`cic.stats.searches` (the default: `fallback`). The paths share delta (a union bound): by default each model
alone is a path (any k) and together they get `SINGLE_SHARE` of delta, the mixtures (every pair of models, a
later model skipping the ones between, and all models together) the rest; the certified path with the most
coverage (or the least cost at a coverage floor) is returned. The guarantee: with probability
>= 1 - delta over the calibration draw, the returned thresholds have system risk <= alpha, conditionally on
every model's calibration scores (the paths, like a single model's candidates, depend on the scores only),
assuming calibration and future questions are exchangeable and each model's answers are fixed by the question
(what the store holds). Not covered: a model whose behaviour changes after calibration (the monitor's job).

**Estimator choice.** Picking the best of K gates certified at delta each on the same data can be wrong with
probability up to K·delta. `choose_estimator` certifies each estimator at delta / K (or at shares from a prior
measured on other data: `cic.stats.estimator_prior`) and returns the one with the most coverage: P(the chosen gate
has risk > alpha) <= P(some estimator's gate has) <= sum of the shares = delta.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats._validation import checked
from cic.stats.estimator_prior import checked_shares, prior_shares, uniform_shares
from cic.stats.searches import DEFAULT_SEARCH, Setting, get_search, run_search

#: The share of delta the paths with one model alone get together (why: docs/statistics.md, "Which paths"): a
#: system never answers much less than its best model alone, and mixtures keep what they add where models differ.
SINGLE_SHARE = 0.6
#: Two models' mixtures: per model, the weight of its score quantile (model i answers at level q when
#: F_i(u_i) <= w_i·q; weight 0: it never answers).
TWO_MODEL_MIXTURES: tuple[tuple[float, ...], ...] = ((0.25, 1.0), (0.5, 1.0), (1.0, 1.0), (1.0, 0.5))
#: With a favoured model (`favour=`): its share of delta, alone; the default paths share the rest.
FAVOUR_SHARE = 0.9


def default_paths(k: int, delta: float) -> tuple[tuple[tuple[float, ...], float], ...]:
    """Label-free paths for k models with each one's share of delta (summing to delta): each model alone
    (`SINGLE_SHARE` of delta split equally), then the mixtures: for two models `TWO_MODEL_MIXTURES`; for more,
    every pair (i, j) with weights (1, 1) and (0.5, 1) — model j may skip the ones between — and all models at
    weight 1 and at weights doubling towards the last."""
    alone = [tuple(1.0 if j == i else 0.0 for j in range(k)) for i in range(k)]
    if k == 2:
        mixed = list(TWO_MODEL_MIXTURES)
    else:
        mixed = []
        for i in range(k):
            for j in range(i + 1, k):
                for a in (1.0, 0.5):
                    mixed.append(tuple(a if m == i else 1.0 if m == j else 0.0 for m in range(k)))
        mixed += [(1.0,) * k, tuple(0.5 ** (k - 1 - m) for m in range(k))]
    return (tuple((p, delta * SINGLE_SHARE / k) for p in alone)
            + tuple((p, delta * (1 - SINGLE_SHARE) / len(mixed)) for p in mixed))


def given_paths(paths: Sequence[Any], delta: float) -> tuple[tuple[tuple[float, ...], float], ...]:
    """A caller's paths with their shares: bare weights share delta equally; (weights, share) pairs keep their
    shares, which must be positive and sum to at most delta (else the union bound would not hold)."""
    if not paths:
        raise UserError("paths = []: give at least one path (weights per model)")
    pairs = [p for p in paths if len(p) == 2 and isinstance(p[0], Sequence) and not isinstance(p[0], str)]
    if pairs and len(pairs) != len(paths):
        raise UserError("paths: give every path as weights, or every one as (weights, share), not a mixture")
    if not pairs:
        return tuple((tuple(float(w) for w in p), delta / len(paths)) for p in paths)
    shares = [float(share) for _, share in pairs]
    if not all(share > 0 and math.isfinite(share) for share in shares):
        raise UserError(f"paths: shares = {shares!r}: each must be a positive number")
    if sum(shares) > delta * (1 + 1e-12):
        raise UserError(f"paths: shares sum to {sum(shares):g} > delta = {delta:g}; the union bound needs them to "
                        "sum to at most delta")
    return tuple((tuple(float(w) for w in weights), share) for (weights, _), share in zip(pairs, shares, strict=True))


def favourite(favour: int | str, us: Sequence[np.ndarray], names: Sequence[str]) -> int:
    """The favoured model's index: given by index or name, or "scores" — the lowest median calibration score (reads
    scores only, never a label; meaningful where the models' scores are on one scale, e.g. the same estimator)."""
    if isinstance(favour, str) and favour.strip().lower() == "scores":
        return int(np.argmin([float(np.median(u)) for u in us]))
    if isinstance(favour, str):
        if favour not in names:
            raise UserError(f"favour = {favour!r}: not one of the cascade's models ({', '.join(names)}), nor 'scores'")
        return list(names).index(favour)
    if not 0 <= int(favour) < len(us):
        raise UserError(f"favour = {favour!r}: a model index from 0 to {len(us) - 1}")
    return int(favour)


def favoured_paths(k: int, delta: float, favoured: int,
                   share: float = FAVOUR_SHARE) -> tuple[tuple[tuple[float, ...], float], ...]:
    """The favoured model alone at `share` of delta, the default paths at the rest (each scaled): they sum to
    delta. Where one model dominates, its gate certified nearly at delta is what the system keeps; where the
    models complement, the mixtures still get their share."""
    if not 0 < share < 1:
        raise UserError(f"favour_share = {share!r}: must lie strictly between 0 and 1")
    alone = tuple(1.0 if j == favoured else 0.0 for j in range(k))
    rest = [(path, part * (1 - share)) for path, part in default_paths(k, delta)]
    return ((alone, delta * share + sum(part for path, part in rest if path == alone)),
            *((path, part) for path, part in rest if path != alone))


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
    path_delta: float = math.nan  # the share of delta this path was searched at

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
                      costs: Sequence[Any] | None = None, paths: Sequence[Any] | None = None,
                      min_coverage: float | None = None, favour: int | str | None = None,
                      favour_share: float = FAVOUR_SHARE) -> CascadeResult:
    """Certify a cascade of models (cost order) on the same calibration questions.

    `scores[i]`, `errors[i]`: model i's uncertainty and 0/1 error on question j (aligned by question). Each path
    is searched at its share of delta (`default_paths`); `paths` given here are weights sharing delta equally, or
    (weights, share) pairs whose shares sum to at most delta. `favour` (a model's index or name, or "scores": the
    model whose calibration scores have the lowest median — label-free, for models scored alike) puts that model
    alone at `favour_share` of delta and the default paths at the rest (`favoured_paths`). The result is the
    certified path with the most coverage, or, with `min_coverage`, the cheapest (by `costs`: model i's cost per
    call — one number, or one per question where it varies, e.g. generations an adaptive score drew — every model
    up to the answering one called) among those answering at least that share.
    """
    us = [np.asarray(u, dtype=float) for u in scores]
    es = [np.asarray(e) for e in errors]
    _check_cascade(us, es, models, costs)
    names = tuple(models) if models is not None else tuple(f"model{i + 1}" for i in range(len(us)))
    bound = _bounds.resolve_bound(bound)
    plan = get_search(search)
    n = us[0].shape[0]
    if favour is not None and paths is not None:
        raise UserError("give either paths= or favour=, not both: favour builds its paths")
    shared = (given_paths(paths, float(delta)) if paths is not None else
              favoured_paths(len(us), float(delta), favourite(favour, us, names), favour_share)
              if favour is not None else default_paths(len(us), float(delta)))
    found = []
    for raw, share in shared:
        path = (tuple(raw) + (raw[-1],) * max(0, len(us) - len(raw)))[:len(us)]  # more models: the last weight
        values, accepted, wrong = cascade_counts(us, es, path)
        outcome = run_search(plan, values, accepted, wrong, setting=Setting(n, bound, float(alpha)),
                             delta=share, lazy=True)
        index = int(outcome.index[0])
        found.append(replace(_result(us, es, names, costs, path, values, accepted, wrong, index,
                                     float(outcome.level[0]), alpha, delta, bound, plan.name), path_delta=share))
    return _pick(found, min_coverage)


def _check_cascade(us: list[np.ndarray], es: list[np.ndarray], models: Sequence[str] | None,
                   costs: Sequence[Any] | None) -> None:
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
    for i, c in enumerate(costs if costs is not None else ()):
        each = np.asarray(c, dtype=float)
        if each.shape not in ((), (n,)) or not (np.isfinite(each).all() and (each >= 0).all()):
            raise UserError(f"costs[{i}]: must be one number or one per question ({n}), finite and >= 0")


def _result(us: list[np.ndarray], es: list[np.ndarray], names: tuple[str, ...], costs: Sequence[Any] | None,
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
                total += float(np.mean(np.asarray(c, dtype=float) * undecided))
                undecided &= answering != i
        cost = total
    guarantee = (f"P(system error among answered <= {alpha:g}) >= {1 - delta:g}: {len(us)}-model cascade, "
                 f"thresholds along label-free paths of score quantiles searched by {search}, each path at its "
                 "share of delta (union over paths); conditional on every model's calibration scores, "
                 "exchangeable questions")
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
                     bound: str = "cp", search: str = DEFAULT_SEARCH,
                     prior: Mapping[str, float] | None = None) -> EstimatorChoice:
    """Certify every estimator's (scores, errors) at its share of delta and choose the one accepting the most
    calibration answers: the chosen gate has risk <= alpha with probability >= 1 - delta (union bound over the K).
    Shares are delta / K, or with a `prior` (one number per estimator from other data, larger = better) the
    best-ranked at most of delta (`cic.stats.estimator_prior`). One model's `certify_system`, every result kept."""
    if not tables:
        raise UserError("choose_estimator needs at least one estimator's (scores, errors)")
    shares = prior_shares(list(tables), prior, delta)
    choice = certify_system({name: ([s], [e]) for name, (s, e) in tables.items()}, alpha=alpha, delta=delta,
                            bound=bound, search=search, shares=shares)
    guarantee = (f"P(the chosen gate's error among accepted <= {alpha:g}) >= {1 - delta:g}: each of {len(tables)} "
                 f"estimators certified at {shares_clause(shares, delta, prior)}, the largest coverage chosen")
    return EstimatorChoice(choice.estimator, choice.result if choice.estimator else None, choice.results,
                           float(delta), guarantee)

@dataclass(frozen=True)
class SystemChoice:
    """A system certified with its estimator chosen: each of the K candidate estimators at delta / K, the one
    answering the most calibration questions kept (estimator None: no candidate certifies anything)."""

    estimator: str | None
    thresholds: tuple[float | None, ...]
    result: Any  # the kept candidate's CascadeResult (several stages) or CalibrationResult (one); the first if none
    candidates: int
    results: Mapping[str, Any] = field(default_factory=dict)  # every candidate's, by name

    @property
    def shares(self) -> tuple[float, ...]:
        if self.estimator is None:
            return (0.0,) * len(self.thresholds)
        if isinstance(self.result, CascadeResult):
            return self.result.shares
        n = self.result.n_calibration
        return (self.result.n_accepted / n if n else 0.0,)


def shares_clause(shares: Mapping[str, float], delta: float, prior: Mapping[str, float] | None) -> str:
    """How delta was split, in the guarantee's words."""
    if not prior:
        return f"delta / {len(shares)} = {delta / len(shares):.4g}"
    ranked = sorted(shares, key=lambda n: -shares[n])
    top = ", ".join(f"{n} {shares[n]:.4g}" for n in ranked[:2])
    rest = f", the others {shares[ranked[-1]]:.4g} each" if len(ranked) > 2 else ""
    return (f"its share of delta ranked on other data ({top}{rest}; the prior is assumed independent of these "
            "calibration questions)")


def certify_system(tables: Mapping[str, tuple[Sequence[Any], Sequence[Any]]], *, alpha: float, delta: float = 0.05,
                   bound: str = "cp", search: str = DEFAULT_SEARCH, models: Sequence[str] | None = None,
                   costs: Sequence[float] | None = None, favour: int | str | None = None,
                   shares: Mapping[str, float] | None = None) -> SystemChoice:
    """Certify a system of one stage (a gate) or several (a cascade) for each candidate estimator at delta / K
    and keep the one answering the most (a tie: the first in `tables` order): P(the kept system's risk > alpha)
    <= delta (union bound over the K).
    `tables[name]` = (per stage scores, per stage errors) on the same questions; `favour`: a cascade's favoured
    model (`calibrate_cascade`); `shares`: each candidate's own share of delta instead of delta / K (positive,
    summing to at most delta: `cic.stats.estimator_prior`)."""
    from cic.stats.calibration import calibrate

    if not tables:
        raise UserError("certify_system needs at least one estimator's scores and errors")
    levels = checked_shares(list(tables), shares, delta) if shares is not None else uniform_shares(list(tables), delta)
    found: list[tuple[str, tuple[float | None, ...], Any, int]] = []
    for name, (us, es) in tables.items():
        share = levels[name]
        if len(us) == 1:
            result = calibrate(us[0], es[0], alpha=alpha, delta=share, bound=bound, search=search, keep_table=False)
            found.append((name, (result.threshold,), result, result.n_accepted))
        else:
            result = calibrate_cascade(us, es, alpha=alpha, delta=share, bound=bound, search=search, models=models,
                                       costs=costs, favour=favour)
            found.append((name, result.thresholds, result, result.n_accepted))
    results = {f[0]: f[2] for f in found}
    certified = [f for f in found if any(t is not None for t in f[1])]
    if not certified:
        return SystemChoice(None, (None,) * len(found[0][1]), found[0][2], len(tables), results)
    name, thresholds, result, _ = max(certified, key=lambda f: f[3])
    return SystemChoice(name, thresholds, result, len(tables), results)


def evaluate_system_splits(tables: Mapping[str, tuple[Sequence[Any], Sequence[Any]]], *, alphas: Sequence[float],
                           bounds: Sequence[str], delta: float = 0.05, search: str = DEFAULT_SEARCH,
                           n_splits: int = 100, cal_fraction: float = 0.5, seed: int = 0,
                           costs: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """The split protocol for `certify_system`, on the splits `cic.split_masks` draws for these sizes and seed
    (those of `evaluate_splits`): per (alpha, bound) and split, certify on the calibration part and measure the
    system on the test part. Per row: mean test FDR, its spread and the share of splits above alpha (over splits
    answering something), mean coverage, fails (splits certifying nothing), `shares_mean` (per stage, the share of
    test questions it answers) and `chosen_shares` (per candidate estimator, the share of splits keeping it)."""
    from cic.stats.protocol import split_masks, summarize_splits

    names = list(tables)
    us = {k: [np.asarray(u, dtype=float) for u in tables[k][0]] for k in names}
    es = {k: [np.asarray(e, dtype=np.int64) for e in tables[k][1]] for k in names}
    n = us[names[0]][0].shape[0]
    if any(a.shape != (n,) for k in names for a in (*us[k], *es[k])):
        raise UserError(f"every estimator and stage needs scores and errors on the same {n} questions")
    stages = len(us[names[0]])
    masks = split_masks(n, n_splits, cal_fraction, seed)
    rows = []
    for alpha in alphas:
        for bound in bounds:
            found, fdr, coverage, shares, chosen = [], [], [], [], []
            for cal in masks:
                test = ~cal
                choice = certify_system({k: ([u[cal] for u in us[k]], [e[cal] for e in es[k]]) for k in names},
                                        alpha=alpha, delta=delta, bound=bound, search=search, costs=costs)
                chosen.append(choice.estimator)
                found.append(choice.estimator is not None)
                kept = choice.estimator or names[0]
                answering = answering_model([u[test] for u in us[kept]], choice.thresholds)
                answered = answering < stages
                wrong = np.choose(np.minimum(answering, stages - 1), [e[test] for e in es[kept]]) * answered
                fdr.append(wrong.sum() / answered.sum() if answered.any() else np.nan)
                coverage.append(answered.mean())
                shares.append([float(np.mean(answering == i)) for i in range(stages)])
            out = summarize_splits({"found": np.array(found), "fdr": np.array(fdr, dtype=float),
                                    "coverage": np.array(coverage),
                                    "correct_coverage": np.full(len(masks), np.nan)}, alpha)  # no one "correct"
            rows.append({"alpha": float(alpha), "bound": bound, "search": search, "delta": float(delta), **out,
                         "shares_mean": np.mean(shares, axis=0).tolist(),
                         "chosen_shares": [chosen.count(k) / len(masks) for k in names],
                         "n_cal": int(masks[0].sum()), "n_test": int((~masks[0]).sum())})
    return rows
