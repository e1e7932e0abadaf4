"""Certify with many judge labels corrected by a few people's: a prediction-powered bound on the error among accepted.

For a judge's verdict J (1 = wrong) on every calibration question and a person's H on a random subset,
R(t) = P(H = 1 | U <= t) = E[J | U <= t] + E[H - J | U <= t]. The first term is bounded from the judge labels of
every accepted question (Clopper–Pearson on their count), the second — the rectifier, in [-1, 1] — from the
accepted questions people labelled, by a betting confidence bound that adapts to how rarely judge and people
disagree (Waudby-Smith & Ramdas 2024, JRSS-B 86(1): the predictable plug-in bets, capital checked at every step by
Ville's inequality). Each part holds at its share of the level (`judge_share`·γ and the rest), so the sum bounds
R(t) at γ whatever the judge does — the finite-sample form of prediction-powered inference (Angelopoulos, Bates,
Fannjiang, Jordan & Zrnic 2023, Science 382: a bound on the judge's mean plus one on the rectifier). A biased judge
costs power, never validity. The threshold search runs on these tests exactly as on the binomial ones.

Label assumption: the judge labelled every calibration question; people labelled a subset chosen independently of
the scores and of every label (at random), so their accepted questions are a random sample of the accepted ones.
The people's questions enter the betting in the order of their ids' hashes (or, without ids, a fixed pseudo-random
order of the rows, seed `ORDER_SEED`): an order that does not follow the scores or the labels.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats import bounds as _bounds
from cic.stats._validation import as_errors, as_scores, check_open_unit

ORDER_SEED = 20231110  # the betting order of the people's questions: fixed, independent of every score and label
BET_CAP = 0.95  # a bet never risks more than this share of the capital (Waudby-Smith & Ramdas' c; measured)
BISECTIONS = 24  # the rectifier bound is the upper end of the last bracket: conservative by < 2^-24
MATRIX_CELLS = 1 << 22  # counts × people evaluated at once


def judged_labels(human: Any, judge: Any) -> tuple[np.ndarray, np.ndarray]:
    """(judge errors 0/1, human errors as float with NaN where no person labelled), checked: every question needs a
    judge label, at least one a human label, and human labels are 0/1."""
    j = as_errors(judge, "judge")
    h = np.asarray(human, dtype=np.float64)
    if h.ndim != 1 or h.shape != j.shape:
        raise UserError(f"human: needs one value per question like judge ({j.shape[0]}); got shape {h.shape}")
    given = ~np.isnan(h)
    bad = given & (h != 0) & (h != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"human[{i}] = {h[i].item()!r}: human errors must be 0/1 (or missing where no person labelled)")
    if not given.any():
        raise UserError("human: no question carries a human label; label a random subset (or use calibrate "
                        "with the judge alone, whose guarantee is then about the judge's verdicts)")
    return j, h


@dataclass(frozen=True)
class Rectifier:
    """The people-labelled questions sorted by score, their rectifier x = (H - J + 1) / 2 in [0, 1] in the betting
    order, and for each the rank of its score: the questions accepted by a threshold holding k of them are those
    with rank < k."""

    scores: np.ndarray  # ascending
    x: np.ndarray  # in betting order
    rank: np.ndarray  # per betting position, the position in score order

    @classmethod
    def build(cls, scores: np.ndarray, judge: np.ndarray, human: np.ndarray, keys: Any = None) -> Rectifier:
        """`keys`: one id per question (e.g. question ids), independent of scores and labels; the bets take the
        people's questions in the order of their ids' hashes, so the same questions in any row order give the
        same bound. Without ids, in a fixed pseudo-random order of the rows (the rows must then not be sorted by
        score or label)."""
        given = ~np.isnan(human)
        s, x = scores[given], (human[given] - judge[given] + 1.0) / 2.0
        by_score = np.argsort(s, kind="stable")
        rank_of = np.empty_like(by_score)
        rank_of[by_score] = np.arange(by_score.shape[0])
        if keys is None:
            order = np.random.default_rng(ORDER_SEED).permutation(s.shape[0])
        else:
            ids = [str(k) for k, g in zip(keys, given, strict=True) if g]
            order = np.argsort([hashlib.blake2b(i.encode(), digest_size=8).hexdigest() for i in ids], kind="stable")
        return cls(s[by_score], x[order], rank_of[order])

    def accepted(self, thresholds: np.ndarray) -> np.ndarray:
        """How many people-labelled questions each threshold accepts (ties included)."""
        return np.searchsorted(self.scores, thresholds, side="right")

    def upper(self, counts: np.ndarray, gamma: float) -> np.ndarray:
        """Per count k, an upper bound on E[H - J | accepted] valid at level gamma from the k accepted people's
        labels (1 where k = 0 or the bets never grow enough)."""
        counts = np.asarray(counts, dtype=np.int64)
        out = np.ones(counts.shape[0])
        step = max(1, MATRIX_CELLS // max(1, self.x.shape[0]))
        for a in range(0, counts.shape[0], step):
            out[a:a + step] = self._upper_block(counts[a:a + step], gamma)
        return out

    def _upper_block(self, counts: np.ndarray, gamma: float) -> np.ndarray:
        mask = self.rank[None, :] < counts[:, None]  # (counts, people): which people's questions each count holds
        x = self.x[None, :]
        seen = np.cumsum(mask, axis=1)
        mean = (0.5 + np.cumsum(mask * x, axis=1)) / (1.0 + seen)  # WSR's running mean, prior 1/2
        var = (0.25 + np.cumsum(mask * (x - mean) ** 2, axis=1)) / (1.0 + seen)
        var_before = np.concatenate([np.full((counts.shape[0], 1), 0.25), var[:, :-1]], axis=1)
        log_goal = math.log(1.0 / gamma)
        raw = np.sqrt(2.0 * log_goal / (np.maximum(counts, 1)[:, None] * var_before))

        def rejects(m: np.ndarray) -> np.ndarray:
            """Whether H0: E[x] >= m is rejected: the capital betting on x < m reaches 1/gamma at some step.
            Each factor grows with m, so a rejected m rejects every larger one (the bound is a threshold in m)."""
            cap = BET_CAP / np.maximum(1.0 - m, 1e-12)
            bet = np.minimum(raw, cap[:, None])
            log_capital = np.cumsum(np.where(mask, np.log1p(bet * (m[:, None] - x)), 0.0), axis=1)
            return log_capital.max(axis=1) >= log_goal

        lo, hi = np.zeros(counts.shape[0]), np.ones(counts.shape[0])
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2.0
            ok = rejects(mid)
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        return np.where(counts > 0, 2.0 * hi - 1.0, 1.0)  # back from x to H - J


class JudgedOracle:
    """`feasible_at(gamma, cols)` for the searches: the judge's Clopper–Pearson bound at judge_share·gamma plus the
    rectifier's at the rest is <= alpha, per candidate threshold; rectifier bounds kept per (level, count)."""

    def __init__(self, thresholds: np.ndarray, n: np.ndarray, fd: np.ndarray, rectifier: Rectifier, *,
                 alpha: float, judge_share: float) -> None:
        self.thresholds, self.n, self.fd, self.rectifier = thresholds, n, fd, rectifier
        self.alpha, self.judge_share = alpha, judge_share
        self.people = rectifier.accepted(thresholds)
        self._kept: dict[float, dict[int, float]] = {}

    def bound(self, gamma: float, cols: Any = None) -> np.ndarray:
        """The prediction-powered upper bound on R(t) at level gamma for the candidates `cols` (default: all)."""
        cols = slice(None) if cols is None else cols
        n, fd, people = self.n[cols], self.fd[cols], self.people[cols]
        judge = np.asarray(_bounds.ucb("cp", fd, n, self.judge_share * gamma), dtype=np.float64)
        kept = self._kept.setdefault(float(gamma), {})
        missing = np.array(sorted(set(np.unique(people).tolist()) - set(kept)), dtype=np.int64)
        if missing.size:
            found = self.rectifier.upper(missing, (1.0 - self.judge_share) * gamma)
            kept.update(zip(missing.tolist(), found.tolist(), strict=True))
        rect = np.array([kept[int(k)] for k in people]) if people.size else np.zeros(0)
        return np.where(n > 0, judge + rect, np.inf)

    def __call__(self, gamma: float, cols: Any = None) -> np.ndarray:
        return (self.bound(gamma, cols) <= self.alpha)[None, :]


def check_judge_share(value: Any) -> float:
    """The judge's share of each test's level, in (0, 1)."""
    return check_open_unit(value, "judge_share")


def judged_scores(scores: Any, judge: Any, human: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores, judge errors and human errors (NaN: unlabelled) of one table, checked to one length."""
    s = as_scores(scores)
    given = as_errors(judge, "judge")
    if s.shape[0] != given.shape[0]:
        raise UserError(f"judge: has {given.shape[0]} values for {s.shape[0]} scores; give one per question")
    j, h = judged_labels(human, judge)
    return s, j, h
