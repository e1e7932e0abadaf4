"""Two-sided certificates: a lower confidence bound on the share of questions a certified gate answers.

The threshold t̂ is chosen on the calibration scores, so a bound for one fixed threshold would not hold at it. The
Dvoretzky–Kiefer–Wolfowitz inequality with Massart's constant holds for every threshold at once:
P(sup_t F̂_n(t) − F(t) > ε) ≤ exp(−2nε²) whenever that is ≤ 1/2 (Massart 1990, Ann. Probab. 18(3), 1269–1283),
with F(t) = P(U ≤ t) the share a gate at t answers and F̂_n(t) = n(t)/n its calibration share. So with
ε = sqrt(ln(1/δ) / (2n)), F(t̂) ≥ n(t̂)/n − ε with probability ≥ 1 − δ whatever the search picked; ties and
discrete scores only make it conservative (the inequality holds for any F). Above δ = 1/2 the two-sided constant
is used, ε = sqrt(ln(2/δ) / (2n)). The bound reads scores only, never a label; the scores must be exchangeable
with the questions the gate will serve — the same assumption as the risk certificate. Together with the risk
claim (each at δ), both hold at once with probability ≥ 1 − 2δ (a union bound).
"""

from __future__ import annotations

import math

from cic.errors import UserError


def coverage_margin(n: int, delta: float) -> float:
    """ε of the one-sided DKW–Massart bound for n calibration scores at level δ (two-sided constant above 1/2)."""
    if n < 1:
        raise UserError(f"n = {n!r}: the coverage bound needs at least one calibration score")
    level = delta if delta <= 0.5 else delta / 2.0  # Massart's one-sided constant needs exp(-2nε²) <= 1/2
    return math.sqrt(math.log(1.0 / level) / (2.0 * n))


def coverage_lcb(n_accepted: int, n_calibration: int, delta: float) -> float:
    """A lower bound, valid with probability ≥ 1 − δ, on the share of questions the gate answers: the calibration
    share it accepts less the DKW–Massart margin, floored at 0 (0 for a gate that answers nothing)."""
    if n_accepted <= 0:
        return 0.0
    return max(0.0, n_accepted / n_calibration - coverage_margin(n_calibration, delta))


def coverage_claim(lcb: float, delta: float) -> str:
    """The coverage certificate in words, as every surface that shows it says it."""
    return (f"answers >= {lcb:.3f} of questions with probability >= {1 - delta:g} (DKW bound; the labelled "
            "calibration questions exchangeable with served ones: labels missing, if at all, independently of the "
            f"score; with the error claim both hold with probability >= {max(0.0, 1 - 2 * delta):g})")
