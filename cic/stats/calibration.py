"""Threshold search: the largest uncertainty threshold whose error rate among accepted answers is certified.

`calibrate(scores, errors, alpha=...)` returns a frozen `CalibrationResult`. The search is one object of
`cic.stats.searches.SEARCHES` (its rule and its guarantee) run by `searches.run_search`, the one search pipeline
the split protocol and the simulator share; the default, `fallback`, carries a valid family-wise guarantee.
This module counts n(t) and FD(t) on one sorted set, bins huge inputs for the paper search and assembles the
result. A threshold t accepts every score U <= t (ties included).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats._validation import (
    as_pair,
    as_scores,
    check_positive_int,
    checked,
    parse_document,
)
from cic.stats.coverage import coverage_lcb
from cic.stats.gate import Gate
from cic.stats.judged import JudgedOracle, Rectifier, check_judge_share, judged_scores
from cic.stats.searches import (
    DEFAULT_SEARCH,
    SEARCHES,
    Search,
    Setting,
    check_search_args,
    compact_candidates,
    get_search,
    run_search,
    search_paper,
)

#: The label assumption of a judge-plus-people certificate, as every surface that shows one says it.
JUDGED_ASSUMPTION = ("the judge labelled every calibration question, people a subset chosen at random, independently "
                     "of the scores and the labels")

if TYPE_CHECKING:
    import polars as pl

# ----------------------------------------------------------------------------------------------------------
# Counting n(t) and FD(t)


@dataclass(frozen=True)
class SortedCalibration:
    """Calibration scores sorted ascending with error counts: n(t) and FD(t) for any t in O(log N).

    `errors_through[i]` is the number of errors among the first i + 1 sorted scores; at the last position of
    each run of equal scores — the only positions a threshold lands on — that is FD(scores[i]), ties
    included. Built without an argsort (NumPy sorts values several times faster than it sorts indices):
    non-negative scores, the usual case for uncertainty, are sorted once as 64-bit keys carrying the error
    bit below the score's bits; other scores by two value sorts (all scores, wrong answers' scores).
    """

    scores: np.ndarray  # ascending
    errors_through: np.ndarray

    @classmethod
    def build(cls, scores: np.ndarray, errors: np.ndarray) -> SortedCalibration:
        if not np.signbit(scores).any():
            # For floats >= +0 the IEEE bits order like the values and the top bit is 0, so the shifted
            # bits with the error as lowest bit sort by (score, error) exactly.
            keys = (scores.view(np.uint64) << np.uint64(1)) | errors.astype(np.uint64)
            keys.sort()
            ordered = (keys >> np.uint64(1)).view(np.float64)
            return cls(ordered, np.cumsum(keys & np.uint64(1), dtype=np.int64))
        ordered = np.sort(scores)
        wrong = np.sort(scores[errors.astype(bool)])
        last_tie = np.searchsorted(ordered, wrong, side="right") - 1
        through = np.cumsum(np.bincount(last_tie, minlength=ordered.shape[0]), dtype=np.int64)
        return cls(ordered, through)

    def unique_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every unique score as a candidate threshold, with n(t) and FD(t) (ties counted as accepted)."""
        return compact_candidates(self.scores, self.errors_through)


# ----------------------------------------------------------------------------------------------------------
# Result


def exact(threshold: float, below: float | None = None) -> str:
    """A threshold as printed rules show it: the shortest decimal at or above it that reads back as the same float
    or, given `below` (the next calibration score above it), stays under it — so the printed rule `score <=
    printed` accepts exactly the calibration answers the certified one does (6 digits could round it down and drop
    one); the gate file keeps the float itself."""
    value = float(threshold) + 0.0
    if value == 0:
        return "0"
    exact_digits = Decimal(repr(value))
    for digits in range(6, 18):
        step = Decimal(1).scaleb(exact_digits.adjusted() - digits + 1)
        shown = exact_digits.quantize(step, rounding=ROUND_CEILING)
        if float(shown) == value or (below is not None and float(shown) < below):
            return format(shown.normalize(), "f") if abs(value) >= 1e-4 else format(shown.normalize(), "e")
    return repr(value)


def beside(score: float, threshold: float) -> tuple[str, str]:
    """A score and a threshold printed side by side with the fewest digits (at least 4, the same for both) that
    keep the score on the side of the threshold it is on: comparing the printed numbers reaches the gate's
    decision (`score <= threshold` answers)."""
    for digits in range(4, 18):
        shown = format(score + 0.0, f".{digits}g"), format(threshold + 0.0, f".{digits}g")
        if (float(shown[0]) <= float(shown[1])) == (score <= threshold):
            return shown
    return repr(score + 0.0), repr(threshold + 0.0)


@dataclass(frozen=True)
class CalibrationResult:
    """The outcome of one calibration: a certified threshold, or None when alpha is unattainable.

    Attributes
    ----------
    threshold : float or None
        Answer when score <= threshold; None means alpha is unattainable (abstain on everything).
    bound_value, n_accepted, n_errors
        The UCB, n and FD on the calibration set at the threshold.
    gamma : float
        The level the threshold was certified at (delta; delta / K for Bonferroni; a Holm step).
    n_candidates, n_tested : int or None
        Candidates (None for the paper search: every unique score) and tests fixed-sequence ran before stopping.
    guarantee : str
        What the search guarantees, from its registry entry.
    coverage_lcb : float or None
        The share of questions the gate answers, certified from below (`cic.stats.coverage`: DKW, probability
        >= 1 - delta); for a gate refused by `min_coverage`, what the best certified threshold would have promised.
    min_coverage : float or None
        The coverage a gate had to promise (None: any); below it the result abstains on everything.
    n_human, n_human_accepted : int or None
        For a judge-plus-people certificate (`calibrate_judged`): the people-labelled questions, and those the
        threshold accepts; None where one kind of label certified (n_accepted, n_errors are then the judge's).

    Examples
    --------
    >>> import numpy as np, cic
    >>> res = cic.calibrate(np.linspace(0, 1, 500), np.zeros(500), alpha=0.05, search="paper")
    >>> res.feasible, res.n_accepted, round(res.bound_value, 4)
    (True, 500, 0.006)
    >>> res.gate().decide(0.3)
    'answer'
    """

    threshold: float | None
    bound_value: float | None
    n_accepted: int
    n_errors: int
    alpha: float
    delta: float
    bound: str
    search: str
    gamma: float
    n_calibration: int
    n_candidates: int | None = None
    n_tested: int | None = None
    n_min: int | None = None
    start: float | None = None
    guarantee: str = ""
    coverage_lcb: float | None = None
    min_coverage: float | None = None
    n_human: int | None = None
    n_human_accepted: int | None = None
    _thresholds: np.ndarray | None = field(default=None, compare=False, repr=False)
    _n: np.ndarray | None = field(default=None, compare=False, repr=False)
    _fd: np.ndarray | None = field(default=None, compare=False, repr=False)
    _data: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)
    _score_above: float | None = field(default=None, compare=False, repr=False)  # next calibration score above it
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def feasible(self) -> bool:
        """True when a threshold was certified; False means alpha is unattainable here."""
        return self.threshold is not None

    @property
    def refused(self) -> bool:
        """True when a threshold was certified for alpha but could not promise `min_coverage`."""
        return self.threshold is None and self.min_coverage is not None and self.coverage_lcb is not None

    @property
    def empirical_risk(self) -> float | None:
        """FD / n at the threshold on the calibration set."""
        return self.n_errors / self.n_accepted if self.n_accepted else None

    def gate(self) -> Gate:
        """The serving artifact: accept U <= threshold, abstain otherwise (everything when None)."""
        return Gate(self.threshold, metadata={
            "alpha": self.alpha, "delta": self.delta, "bound": self.bound, "search": self.search,
            "bound_value": self.bound_value, "n_calibration": self.n_calibration,
            "n_accepted": self.n_accepted, "n_errors": self.n_errors, "coverage_lcb": self.coverage_lcb,
            **({"labels": "judge+people", "n_human": self.n_human, "n_human_accepted": self.n_human_accepted}
               if self.n_human is not None else {}),
        })

    def table(self) -> pl.DataFrame:
        """Every candidate threshold with n, FD, FD/n, its UCB at gamma, feasibility, tested and selected."""
        import polars as pl

        thresholds, n, fd = self._candidates()
        with np.errstate(invalid="ignore", divide="ignore"):
            risk = np.where(n > 0, fd / np.maximum(n, 1), np.nan)
        ucb = np.asarray(_bounds.ucb(self.bound, fd, n, self.gamma), dtype=np.float64)
        ok = np.asarray(_bounds.feasible(self.bound, fd, n, self.alpha, self.gamma), dtype=bool)
        tested = np.zeros(n.shape, dtype=bool)
        tested[self._tested_slice()] = True
        selected = thresholds == self.threshold if self.threshold is not None else np.zeros_like(tested)
        return pl.DataFrame({
            "threshold": thresholds, "n_accepted": n, "n_errors": fd, "empirical_risk": risk,
            "ucb": ucb, "feasible": ok, "tested": tested, "selected": selected,
        })

    def _candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidate thresholds with n and FD: kept by the search, or rebuilt from the calibration data."""
        if self._thresholds is not None and self._n is not None and self._fd is not None:
            return self._thresholds, self._n, self._fd
        if self.n_human is not None:
            raise UserError("table() lists binomial certificates; a judge-plus-people result has none (its tests "
                             "combine two bounds): read threshold, bound_value and n_human_accepted")
        if self._data is None:
            raise UserError("table() is unavailable: this result was loaded from JSON written without "
                             "include_table=True (or calibrated with keep_table=False)")
        if "candidates" not in self._cache:
            self._cache["candidates"] = SortedCalibration.build(*self._data).unique_candidates()
        return self._cache["candidates"]

    def _tested_slice(self) -> slice:
        """Candidates the search evaluated: all of them, or for fixed_sequence a run from the first eligible."""
        if self.search != "fixed_sequence" or self._n is None or self._thresholds is None or self.n_tested is None:
            return slice(None)
        eligible = np.ones(self._n.shape, dtype=bool)  # n_min and start both select a suffix
        if self.n_min is not None:
            eligible &= self._n >= self.n_min
        if self.start is not None:
            eligible &= self._thresholds >= self.start
        first = int(np.argmax(eligible)) if eligible.any() else self._n.shape[0]
        return slice(first, first + self.n_tested)

    @property
    def printed_threshold(self) -> str:
        """The threshold as the summary prints it (`exact`: it accepts exactly the certified calibration answers)."""
        assert self.threshold is not None
        return exact(self.threshold, self._score_above)

    def summary(self) -> str:
        """One human sentence: the certified threshold (printed exactly: `exact`), or that alpha is unattainable."""
        name = _bounds.get_bound(self.bound).label
        if self.refused:
            return (f"alpha = {self.alpha:g} is certified only by a gate that answers >= {self.coverage_lcb:.3f} of "
                    f"questions with probability >= {1 - self.delta:g}, below min coverage {self.min_coverage:g}: "
                    f"refused, abstain on everything")
        if self.threshold is None and self.n_human is not None:
            return (f"alpha = {self.alpha:g} is unattainable at delta = {self.delta:g} (prediction-powered: judge "
                    f"{name} + people's correction, {self.search} search, {self.n_calibration} judged questions, "
                    f"{self.n_human} labelled by people): abstain on everything")
        if self.threshold is None:
            return (f"alpha = {self.alpha:g} is unattainable at delta = {self.delta:g} ({name} bound, "
                    f"{self.search} search over {self.n_candidates or 'every unique score as'} candidates, "
                    f"{self.n_calibration} calibration points): abstain on everything")
        if SEARCHES.find(self.search) is not None and SEARCHES[self.search].guarantee_kind == "expectation":
            return (f"answer when score <= {self.printed_threshold}: error among accepted <= {self.alpha:g} in "
                    f"expectation over calibration sets, not with probability {1 - self.delta:g} (FD + 1 <= alpha·n "
                    f"at n = {self.n_accepted}, FD = {self.n_errors}; {name} UCB {self.bound_value:.4f}; "
                    f"{self.search} search){self._coverage_clause()}")
        if self.n_human is not None:
            return (f"answer when score <= {self.printed_threshold}: error among accepted <= {self.alpha:g} with "
                    f"probability >= {1 - self.delta:g} (prediction-powered: judge {name} + people's correction, UCB "
                    f"{self.bound_value:.4f} at n = {self.n_accepted} judged, {self.n_human_accepted} of them labelled "
                    f"by people; {self.search} search; {JUDGED_ASSUMPTION}){self._coverage_clause()}")
        return (f"answer when score <= {self.printed_threshold}: error among accepted <= {self.alpha:g} with "
                f"probability >= {1 - self.delta:g} ({name} UCB {self.bound_value:.4f} at n = {self.n_accepted}, "
                f"FD = {self.n_errors}; {self.search} search){self._coverage_clause()}")

    def _coverage_clause(self) -> str:
        """'; answers >= c of questions with probability >= 1 - delta' where the result carries its bound."""
        if self.coverage_lcb is None:
            return ""
        return f"; answers >= {self.coverage_lcb:.3f} of questions with probability >= {1 - self.delta:g}"

    def __str__(self) -> str:
        return self.summary()

    # -- JSON ------------------------------------------------------------------------------------------------

    def to_json(self, *, include_table: bool = False, indent: int | None = 2) -> str:
        """Serialise the result (and, on request, the candidate arrays so table() works after loading)."""
        payload: dict[str, Any] = {"kind": "cic.calibration_result", "version": 1}
        for f in fields(self):
            if not f.name.startswith("_"):
                payload[f.name] = getattr(self, f.name)
        if include_table:
            thresholds, n, fd = self._candidates()
            payload["candidates"] = {"threshold": thresholds.tolist(), "n": n.tolist(), "fd": fd.tolist()}
        return json.dumps(payload, indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> CalibrationResult:
        """Inverse of to_json; rejects documents that are not CIC calibration results."""
        payload = parse_document(text, "cic.calibration_result", "CIC calibration result")
        cand = payload.pop("candidates", None)
        payload.pop("kind")
        payload.pop("version", None)
        names = {f.name for f in fields(cls) if not f.name.startswith("_")}
        unknown = set(payload) - names
        if unknown:
            raise UserError(f"calibration result JSON has unknown field(s): {', '.join(sorted(unknown))}")
        extra: dict[str, Any] = {}
        if cand is not None:
            extra = {"_thresholds": np.asarray(cand["threshold"], dtype=np.float64),
                     "_n": np.asarray(cand["n"], dtype=np.int64), "_fd": np.asarray(cand["fd"], dtype=np.int64)}
        return cls(**payload, **extra)


# ----------------------------------------------------------------------------------------------------------
# Grids fixed in advance


def uniform_grid(low: float, high: float, k: int) -> np.ndarray:
    """K evenly spaced thresholds over [low, high], fixed before the calibration labels are seen.

    Parameters
    ----------
    low, high : float
        The range (finite, low < high when k > 1).
    k : int
        Number of thresholds; k = 1 gives [high].

    Returns
    -------
    numpy.ndarray
        The grid, ascending (for the bonferroni and holm searches).

    Examples
    --------
    >>> uniform_grid(0.0, 1.0, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    k = check_positive_int(k, "k")
    lo, hi = float(low), float(high)
    if not (math.isfinite(lo) and math.isfinite(hi)) or (k > 1 and not lo < hi):
        raise UserError(f"grid range low = {low!r}, high = {high!r}: need finite low < high")
    return np.linspace(lo, hi, k) if k > 1 else np.array([hi])


def quantile_grid(pilot_scores: Any, k: int) -> np.ndarray:
    """K thresholds at evenly spaced quantiles of a *separate* pilot sample (duplicates merged).

    Parameters
    ----------
    pilot_scores : array_like
        Scores of items that are NOT in the calibration set (the grid must not see its labels or scores).
    k : int
        Number of quantiles.

    Returns
    -------
    numpy.ndarray
        Unique thresholds, ascending.

    Examples
    --------
    >>> quantile_grid([0.1, 0.2, 0.3, 0.4], 2).tolist()
    [0.25, 0.4]
    """
    k = check_positive_int(k, "k")
    pilot = as_scores(pilot_scores, "pilot_scores")
    return np.unique(np.quantile(pilot, np.linspace(0.0, 1.0, k + 1)[1:]))


# ----------------------------------------------------------------------------------------------------------
# Entry point


@checked
def calibrate(scores: Any, errors: Any, *, alpha: float, delta: float = 0.05, bound: str = "cp",
              search: str | Search = DEFAULT_SEARCH, grid: Any = None, n_min: int | None = None,
              start: float | None = None, keep_table: bool = True,
              min_coverage: float | None = None) -> CalibrationResult:
    """Learn the largest threshold t with P(error | U <= t) <= alpha certified at confidence 1 - delta.

    Parameters
    ----------
    scores : array_like
        Uncertainty per calibration item (lower = more confident), finite.
    errors : array_like
        1 where the answer is wrong, 0 where it is right (booleans accepted).
    alpha : float
        Target error rate among accepted answers, in (0, 1).
    delta : float
        Allowed probability that the guarantee fails, in (0, 1).
    bound : str
        A name of `cic.stats.bounds.BOUNDS`: "cp" (Clopper–Pearson), "hoeffding", "hoeffding_kl", "bentkus",
        "hoeffding_bentkus".
    search : str or Search
        A `cic.stats.searches.Search` of your own (MAPIE-style: a procedure object; its `select` decides), or a
        name of `cic.stats.searches.SEARCHES`: "fallback" (default: one fixed-sequence line entered at the first
        certifiable count, at n/2, n/4, ... and at an equal-count grid, a passed threshold handing its level on,
        FWER <= delta), "geometric" (chains from n/2, n/4, ... by a union bound), "fixed_sequence" (one chain
        upwards from `start` or the `n_min`-th score at delta; by default n_min is the smallest count at which an
        empirical risk of alpha/2 would be certified, `bounds.half_alpha_n`), "multistart" (four such chains at
        delta / 4), "holm" and "bonferroni" (a `grid` fixed in advance), "paper" (Algorithm 1: every unique
        score at delta, no simultaneous guarantee), "lec" (LEC's rule: a guarantee in expectation only).
    grid, n_min, start
        Search arguments, fixed before the labels are seen.
    keep_table : bool
        Keep the candidates so `result.table()` works.
    min_coverage : float, optional
        Refuse a gate (abstain on everything) unless it answers at least this share of questions with probability
        >= 1 - delta (`cic.stats.coverage`); every result carries its coverage bound either way.

    Returns
    -------
    CalibrationResult
        threshold None when no candidate is certified ("alpha is unattainable"); `result.guarantee` states
        what the search guarantees.

    Examples
    --------
    >>> import numpy as np, cic
    >>> scores = np.linspace(0, 1, 2000); errors = (np.arange(2000) % 50 == 49).astype(int)  # 2% wrong
    >>> result = cic.calibrate(scores, errors, alpha=0.1, delta=0.05)
    >>> result.threshold, result.n_accepted, result.n_errors, result.search
    (1.0, 2000, 40, 'fallback')
    """
    s, e = as_pair(scores, errors)
    bound = _bounds.resolve_bound(bound)
    grid_arr, n_min_v, start_v = check_search_args(search, grid, n_min, start)
    plan = get_search(search)
    common = dict(alpha=alpha, delta=delta, bound=bound, search=plan.name, n_calibration=int(s.shape[0]),
                  guarantee=plan.guarantee)

    if plan.bins_large_inputs and s.shape[0] >= _BINNED_MIN_ITEMS:
        level = plan.level(delta, 1)  # one level for every candidate (the paper's: delta)
        hit = paper_search_binned(s, e, bound=bound, alpha=alpha, gamma=level)
        return _result(hit, gamma=level, min_coverage=min_coverage, **common, _score_above=_score_above(s, hit),
                       _data=(s.copy(), e.copy()) if keep_table else None)  # type: ignore[arg-type]

    data = SortedCalibration.build(s, e)
    thresholds, n, fd = compact_candidates(data.scores, data.errors_through, grid_arr, start_v)
    k = int(thresholds.shape[0])
    outcome = run_search(plan, thresholds, n, fd, setting=Setting(int(s.shape[0]), bound, alpha), delta=delta,
                         n_min=n_min_v, start=start_v, lazy=True)
    best, gamma, n_min_v, n_tested = int(outcome.index[0]), float(outcome.level[0]), outcome.n_min, outcome.n_tested
    hit = (float(thresholds[best]), int(n[best]), int(fd[best])) if best >= 0 else None
    kept = dict(_thresholds=thresholds, _n=n, _fd=fd) if keep_table else {}
    return _result(hit, gamma=gamma, min_coverage=min_coverage,
                   n_candidates=None if not plan.takes_grid else k, n_tested=n_tested,
                   n_min=n_min_v, start=start_v, **common, **kept,
                   _score_above=_score_above(s, hit))  # type: ignore[arg-type]


def calibrate_judged(scores: Any, judge: Any, human: Any, *, alpha: float, delta: float = 0.05,
                     search: str | Search = DEFAULT_SEARCH, judge_share: float = 0.5, n_min: int | None = None,
                     min_coverage: float | None = None, ids: Any = None) -> CalibrationResult:
    """Certify with a judge's labels on every question corrected by people's on a random subset (`cic.stats.judged`).

    `judge`: 1 where the judge calls the answer wrong, for every question; `human`: 1 / 0 where a person labelled it,
    NaN where none did. The guarantee is about the people's verdict: P(person says wrong | U <= t) <= alpha with
    probability >= 1 - delta, whatever the judge does — provided the people's questions are a random subset.
    `ids` (question ids, one per question) fix the order the people's labels are bet on — by their hashes, so any
    row order gives the same result; without them the rows must not be sorted by score or label.
    `judge_share` of each test's level goes to the judge's bound, the rest to the people's correction. Any search
    with a high-probability guarantee runs on these tests: every judged score a candidate, the entries and `n_min`
    read in the people's accepted counts (fixed by the scores and by who labelled, never by a label).

    Examples
    --------
    >>> import numpy as np, cic
    >>> rng = np.random.default_rng(0); s = rng.random(3000); wrong = rng.random(3000) < 0.25 * s
    >>> judge = np.where(rng.random(3000) < 0.97, wrong, ~wrong); human = np.where(np.arange(3000) < 600, wrong, np.nan)
    >>> r = cic.calibrate_judged(s, judge, human, alpha=0.15); r.feasible, r.n_human
    (True, 600)
    """
    s, j, h = judged_scores(scores, judge, human)
    share = check_judge_share(judge_share)
    plan = get_search(search)
    if plan.guarantee_kind != "high-probability":
        raise UserError(f"search = {plan.name!r}: a judge-plus-people certificate needs a search with a "
                        "high-probability guarantee (fallback, geometric, fixed_sequence, multistart)")
    if plan.needs_grid:
        raise UserError(f"search = {plan.name!r} needs a grid; a judge-plus-people certificate searches the scores")
    n_min_v = check_positive_int(n_min, "n_min") if n_min is not None else None
    data = SortedCalibration.build(s, j)
    thresholds, n, fd = compact_candidates(data.scores, data.errors_through)
    if ids is not None and len(ids) != s.shape[0]:
        raise UserError(f"ids: {len(ids)} for {s.shape[0]} scores; give one per question")
    rectifier = Rectifier.build(s, j, h, ids)
    oracle = JudgedOracle(thresholds, n, fd, rectifier, alpha=alpha, judge_share=share)
    # the search's entries and first test read the people's accepted counts (label-free: who labelled is chosen
    # at random), since the people's correction, not the judge's bound, is what needs enough accepted answers
    people = oracle.people.astype(np.int64)
    outcome = run_search(plan, thresholds, people, fd, setting=Setting(int(rectifier.x.shape[0]), "cp", alpha),
                         delta=delta, n_min=n_min_v, oracle=oracle)
    best, gamma = int(outcome.index[0]), float(outcome.level[0])
    common = dict(alpha=alpha, delta=delta, bound="cp", search=plan.name, n_calibration=int(s.shape[0]),
                  guarantee=f"{plan.guarantee}; prediction-powered tests ({JUDGED_ASSUMPTION})", gamma=gamma,
                  n_min=outcome.n_min, min_coverage=min_coverage, n_human=int(rectifier.x.shape[0]))
    if best < 0:
        return CalibrationResult(threshold=None, bound_value=None, n_accepted=0, n_errors=0, **common)
    lcb = coverage_lcb(int(n[best]), int(s.shape[0]), delta)
    if min_coverage is not None and lcb < min_coverage:
        return CalibrationResult(threshold=None, bound_value=None, n_accepted=0, n_errors=0, coverage_lcb=lcb,
                                 **common)
    hit = (float(thresholds[best]), int(n[best]), int(fd[best]))
    return CalibrationResult(threshold=hit[0], bound_value=float(oracle.bound(gamma, [best])[0]), n_accepted=hit[1],
                             n_errors=hit[2], coverage_lcb=lcb, n_human_accepted=int(oracle.people[best]), **common,
                             _score_above=_score_above(s, hit))  # type: ignore[arg-type]


def _score_above(scores: np.ndarray, hit: tuple[float, int, int] | None) -> float | None:
    """The smallest calibration score above the certified threshold (None: none, or nothing certified)."""
    if hit is None:
        return None
    higher = scores[scores > hit[0]]
    return float(higher.min()) if higher.size else None


def _result(hit: tuple[float, int, int] | None, **fields_: Any) -> CalibrationResult:
    """Assemble the result from the selected (threshold, n, FD), or from no threshold at all; a threshold whose
    coverage bound falls short of `min_coverage` is refused (no threshold, its bound kept to say why)."""
    if hit is None:
        return CalibrationResult(threshold=None, bound_value=None, n_accepted=0, n_errors=0, **fields_)
    threshold, n_at, fd_at = hit
    lcb = coverage_lcb(n_at, fields_["n_calibration"], fields_["delta"])
    if fields_.get("min_coverage") is not None and lcb < fields_["min_coverage"]:
        return CalibrationResult(threshold=None, bound_value=None, n_accepted=0, n_errors=0, coverage_lcb=lcb,
                                 **fields_)
    value = float(_bounds.ucb(fields_["bound"], fd_at, n_at, fields_["gamma"]))
    return CalibrationResult(threshold=threshold, bound_value=value, n_accepted=n_at, n_errors=fd_at,
                             coverage_lcb=lcb, **fields_)


#: From this many calibration items on, the paper search bins the scores instead of sorting them all.
_BINNED_MIN_ITEMS = 50_000


def paper_search_binned(scores: np.ndarray, errors: np.ndarray, *, bound: str, alpha: float,
                        gamma: float) -> tuple[float, int, int] | None:
    """Algorithm 1's answer (threshold, n, FD) without sorting every score; None when nothing is feasible.

    Scores are counted into equal-width bins. Every bound is decreasing in FD and increasing in n, so a bin
    can hold a feasible candidate only if (errors below the bin, items through the bin) is feasible.
    Groups of such bins are sorted and searched exactly, from the top down, and the first group with a
    feasible candidate holds the answer. Typical inputs sort a few thousand scores instead of all of them;
    the worst case (everything in one bin) costs one full sort. Identical to `search_paper` (tested).
    """
    size = scores.shape[0]
    lo, hi = float(scores.min()), float(scores.max())
    n_bins = int(min(4096, max(16, size // 1024)))
    scale = n_bins / (hi - lo) if hi > lo else 0.0
    if not np.isfinite(scale):  # a range too narrow or too wide to bin: search the plain way
        scale = 0.0
    bins = ((scores - lo) * scale).astype(np.int64)
    np.minimum(bins, n_bins - 1, out=bins)
    counts = np.bincount(bins, minlength=n_bins)
    wrong = np.bincount(bins, weights=errors, minlength=n_bins).astype(np.int64)
    n_through = np.cumsum(counts)
    n_before, fd_before = n_through - counts, np.cumsum(wrong) - wrong
    possible = np.flatnonzero((counts > 0) & np.asarray(
        _bounds.feasible(bound, fd_before, n_through, alpha, gamma), dtype=bool))

    group_items, j = 4096, possible.shape[0] - 1
    while j >= 0:
        top = int(possible[j])
        first = min(max(int(np.searchsorted(n_before, n_through[top] - group_items, side="right")) - 1, 0), top)
        in_group = (bins >= first) & (bins <= top)
        values, n_local, fd_local = SortedCalibration.build(scores[in_group], errors[in_group]).unique_candidates()
        n_all, fd_all = n_local + n_before[first], fd_local + fd_before[first]
        best = search_paper(fd_all, n_all, bound=bound, alpha=alpha, gamma=gamma)
        if best >= 0:
            return float(values[best]), int(n_all[best]), int(fd_all[best])
        j = int(np.searchsorted(possible, first, side="left")) - 1
        group_items *= 2
    return None
