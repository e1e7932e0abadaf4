"""Anytime-valid certification: a threshold certified at whatever time it is read, from every labelled answer.

For a candidate threshold t, each labelled answer that t accepts (score <= t) brings its error Z in {0, 1}, in
arrival order. The null H_t says the error rate among accepted answers is at least alpha given the past:
E[Z_i | accepted, past] >= alpha for every i (stationary traffic: R(t) >= alpha). Under H_t the wealth

    W_n(t) = prod over accepted i <= n of (1 + lambda_i (alpha - Z_i)),  0 <= lambda_i <= c / (1 - alpha), c < 1,

is a nonnegative supermartingale when each bet lambda_i is chosen before Z_i is seen (here aGRAPA, Waudby-Smith &
Ramdas 2023: the running mean of alpha - Z over its running second moment, from the threshold's earlier answers
only), so by Ville's inequality P(W_n(t) >= 1/delta for some n) <= delta. Thresholds are tested in a fixed
sequence from the most conservative (the smallest) up, the grid fixed before any label is seen: t_j is certified
once W(t_1) ... W(t_j) have each reached 1/delta at some time (a crossing is kept). Whatever rate each threshold
has, certifying one whose rate is >= alpha needs the first such threshold in the sequence to cross, so

    P(at some time, a certified threshold has error rate >= alpha among its accepted answers) <= delta,

the probability over the whole stream, read every night or never. What it assumes: the grid is fixed in advance;
each label is counted once, in the order it arrived (a late label counts when it arrives); with non-stationary
traffic the statement is about the conditional rates given the past (rates that stay >= alpha never certify with
probability above delta). What it does not cover: a rate that rises after its threshold was certified — a crossing
is kept, so that is the monitor's job (`cic.stats.monitoring`), and a monitor alarm restarts the state.
Anchors: firstpass-core's `EProcessRiskControl` (betting e-processes per grid point, Bonferroni over the grid) —
the fixed sequence spends all of delta on each threshold in turn instead of delta / G; MAPIE's `RiskMonitoring`
(a time-uniform bound, monitoring only).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.stats._validation import checked

CAP = 0.5  # lambda <= CAP / (1 - alpha): a single error costs at most half the wealth


@dataclass
class AnytimeState:
    """The e-processes of one key's candidate thresholds: small enough to store per key, updated in place."""

    grid: np.ndarray          # candidate thresholds, ascending (the fixed sequence's order)
    alpha: float
    delta: float
    log_wealth: np.ndarray    # log W(t) per threshold
    n: np.ndarray             # accepted answers counted so far per threshold
    total: np.ndarray         # sum of (alpha - Z) over them
    squares: np.ndarray       # sum of (alpha - Z)^2 over them
    crossed: np.ndarray       # W(t) reached 1/delta at some time (kept)
    seen: int = 0             # labelled answers counted (accepted by some threshold or not)

    @classmethod
    @checked
    def start(cls, grid: Any, *, alpha: float, delta: float = 0.05) -> AnytimeState:
        values = np.asarray(grid, dtype=float)  # checked by its declaration: non-empty, finite, strictly increasing
        zeros = np.zeros(values.size)
        return cls(values, float(alpha), float(delta), zeros.copy(), np.zeros(values.size, dtype=np.int64),
                   zeros.copy(), zeros.copy(), np.zeros(values.size, dtype=bool))

    def bets(self) -> np.ndarray:
        """Each threshold's next bet from its past answers only (aGRAPA with one pseudo-answer at rate alpha/2,
        so the first bets are small and positive), clipped to [0, CAP / (1 - alpha)]."""
        x0 = self.alpha / 2
        mean = (self.total + x0) / (self.n + 1)
        second = (self.squares + x0 ** 2) / (self.n + 1)
        return np.clip(mean / np.maximum(second, 1e-12), 0.0, CAP / (1 - self.alpha))

    def update(self, scores: Any, errors: Any) -> None:
        """Count labelled answers in arrival order: each updates every threshold that accepts it."""
        u = np.asarray(scores, dtype=float).ravel()
        z = np.asarray(errors).ravel()
        if u.shape != z.shape or not np.isfinite(u).all() or not np.isin(z, (0, 1)).all():
            raise UserError("scores and errors: equal lengths, finite scores, errors 0 or 1")
        level = math.log(1 / self.delta)
        for score, error in zip(u, z.astype(float), strict=True):
            accepted = self.grid >= score
            if accepted.any():
                x = self.alpha - error
                lam = self.bets()[accepted]
                self.log_wealth[accepted] += np.log1p(lam * x)
                self.n[accepted] += 1
                self.total[accepted] += x
                self.squares[accepted] += x * x
                self.crossed |= self.log_wealth >= level
            self.seen += 1

    @property
    def certified_index(self) -> int:
        """The last threshold of the certified prefix of the sequence (-1: none)."""
        missing = np.flatnonzero(~self.crossed)
        return int(missing[0]) - 1 if missing.size else self.grid.size - 1

    @property
    def threshold(self) -> float | None:
        """The widest certified threshold (None: nothing certified yet)."""
        index = self.certified_index
        return float(self.grid[index]) if index >= 0 else None

    def to_json(self) -> str:
        return json.dumps({"grid": self.grid.tolist(), "alpha": self.alpha, "delta": self.delta,
                           "log_wealth": self.log_wealth.tolist(), "n": self.n.tolist(),
                           "total": self.total.tolist(), "squares": self.squares.tolist(),
                           "crossed": self.crossed.tolist(), "seen": self.seen})

    @classmethod
    def from_json(cls, text: str) -> AnytimeState:
        data = json.loads(text)
        return cls(np.asarray(data["grid"], dtype=float), float(data["alpha"]), float(data["delta"]),
                   np.asarray(data["log_wealth"], dtype=float), np.asarray(data["n"], dtype=np.int64),
                   np.asarray(data["total"], dtype=float), np.asarray(data["squares"], dtype=float),
                   np.asarray(data["crossed"], dtype=bool), int(data["seen"]))
