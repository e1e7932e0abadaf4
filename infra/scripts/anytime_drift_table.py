"""The anytime rule when the error rate rises, side by side with a Bonferroni grid and MAPIE's RiskMonitoring.

    .venv/bin/python infra/scripts/anytime_drift_table.py [--runs 100] [--nights 120] [--per-night 200]

Streams as `anytime_table.py` (scores U ~ Uniform(0, 1), errors with probability 4·alpha·U, so R(t) = 2·alpha·t and
the oracle threshold is 0.5), alpha = 0.1, delta = 0.05, 20 thresholds 0.05 … 1.0 fixed in advance. On the *drift*
stream the error probability doubles from night `drift` (default 60) on: R(t) = 4·alpha·t, the oracle threshold
falls to 0.25 and every threshold served before it (> 0.25) is now invalid. On the *quiet* stream nothing changes.
Rules, each serving one threshold a night:
- **nightly window**: `cic.calibrate` on that night's answers alone, served every night;
- **anytime + CIC monitor** (`recalibration.rule: anytime`): the fixed-sequence state fed every answer, the served
  threshold watched by `cic.stats.monitoring` (e-value of its answers since it was served, alarm at 1/level); an
  alarm withdraws it and restarts the state from that night;
- **Bonferroni grid + CIC monitor** (firstpass-core's `EProcessRiskControl`): the same e-processes, each threshold
  certified on its own once its wealth reaches G/delta, the largest certified served; same monitor and restart;
- **anytime + MAPIE RiskMonitoring**: the fixed-sequence state, the served threshold watched by MAPIE 1.6's
  `RiskMonitoring` (risk "precision" on the answers it accepts, monitoring threshold alpha, test level 0.05).
Printed per rule: night of the first certified threshold, coverage at nights 30 and drift − 1, on the drift stream
the nights from the drift until no invalid threshold is served (withdrawn or narrowed; capped at the last night),
and on the quiet stream the share of runs with a withdrawal (a false alarm: every served threshold there is valid).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.stats.anytime import AnytimeState  # noqa: E402
from cic.stats.monitoring import e_value  # noqa: E402

ALPHA, DELTA, LEVEL = 0.1, 0.05, 0.05
GRID = np.round(np.linspace(0.05, 1.0, 20), 4)
RULES = ("nightly window", "anytime + CIC monitor", "Bonferroni grid + CIC monitor", "anytime + MAPIE RiskMonitoring")


class Served:
    """One rule's state: its e-processes, the threshold it serves, and its monitor's counts since serving it."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.state = self._fresh()
        self.threshold: float | None = None
        self.n = self.k = 0
        self.mapie = None
        self.withdrawals = 0

    def _fresh(self) -> AnytimeState:
        bonferroni = self.rule.startswith("Bonferroni")
        return AnytimeState.start(GRID, alpha=ALPHA, delta=DELTA / GRID.size if bonferroni else DELTA)

    def certified(self) -> float | None:
        if self.rule.startswith("Bonferroni"):
            crossed = self.state.grid[self.state.crossed]
            return float(crossed.max()) if crossed.size else None
        return self.state.threshold

    def night(self, u: np.ndarray, z: np.ndarray) -> float | None:
        """Count the night's answers, watch the served threshold, serve what is certified; returns it."""
        if self.rule == "nightly window":
            self.threshold = cic.calibrate(u, z, alpha=ALPHA, delta=DELTA, keep_table=False).threshold
            return self.threshold
        if self.threshold is not None and self._alarm(u, z):
            self.withdrawals += 1
            self.state, self.threshold, self.mapie = self._fresh(), None, None
            return None  # withdrawn tonight; the restarted state counts from tomorrow
        self.state.update(u, z)
        now = self.certified()
        if now is not None and now != self.threshold:
            self.threshold, self.n, self.k, self.mapie = now, 0, 0, None  # a new gate: its monitor starts
        return self.threshold

    def _alarm(self, u: np.ndarray, z: np.ndarray) -> bool:
        accepted = u <= self.threshold
        if self.rule.endswith("MAPIE RiskMonitoring"):
            from mapie.exchangeability_testing import RiskMonitoring

            if self.mapie is None:
                self.mapie = RiskMonitoring(risk="precision", test_level=LEVEL, threshold=ALPHA, warn=False)
            # precision's risk counts errors among predicted positives: every accepted answer is predicted 1
            self.mapie.update(1 - z[accepted], np.ones(int(accepted.sum()), dtype=int))
            return self.mapie.online_risk_lower_bound_latest is not None and self.mapie.harmful_shift_detected
        self.n += int(accepted.sum())
        self.k += int(z[accepted].sum())
        return e_value(self.n, self.k, ALPHA) >= 1 / LEVEL


def one_run(rng: np.random.Generator, nights: int, per_night: int, drift: int | None) -> dict[str, dict]:
    rules = {rule: Served(rule) for rule in RULES}
    out = {rule: {"first": None, "cover": np.zeros(nights), "invalid_until": None} for rule in RULES}
    for night in range(nights):
        slope = 8 * ALPHA if drift is not None and night >= drift else 4 * ALPHA
        u = rng.random(per_night)
        z = (rng.random(per_night) < np.clip(slope * u, 0, 1)).astype(int)
        for rule, served in rules.items():
            t = served.night(u, z)
            record = out[rule]
            if t is not None:
                record["cover"][night] = min(t, 1.0)
                record["first"] = record["first"] if record["first"] is not None else night + 1
            oracle = 0.25 if drift is not None and night >= drift else 0.5
            if drift is not None and night >= drift and t is not None and t > oracle + 1e-12:
                record["invalid_until"] = night + 1  # the last night an invalid threshold was served
    for rule, served in rules.items():
        out[rule]["withdrawals"] = served.withdrawals
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nights", type=int, default=120)
    parser.add_argument("--per-night", type=int, default=200)
    parser.add_argument("--drift", type=int, default=60)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    rng = np.random.default_rng(2026)
    drifted = [one_run(rng, args.nights, args.per_night, args.drift) for _ in range(args.runs)]
    quiet = [one_run(rng, args.nights, args.per_night, None) for _ in range(args.runs)]
    print(f"α = {ALPHA}, δ = {DELTA}, monitor level {LEVEL}, {args.per_night} labelled answers a night, "
          f"{args.nights} nights, {args.runs} runs per stream; the rate doubles at night {args.drift} on the drift "
          "stream.\n")
    print(f"| rule | first certified (median night) | coverage night 30 | coverage night {args.drift - 1} | "
          "nights from the drift until no invalid threshold serves (median, max) | quiet stream: runs with a "
          "withdrawal |")
    print("|---|---|---|---|---|---|")
    for rule in RULES:
        first = [r[rule]["first"] for r in drifted if r[rule]["first"] is not None]
        cover = np.mean([r[rule]["cover"] for r in drifted], axis=0)
        react = [(r[rule]["invalid_until"] or args.drift) - args.drift for r in drifted]
        false = sum(r[rule]["withdrawals"] > 0 for r in quiet) / len(quiet)
        first_said = f"{int(np.median(first))}" if first else "never"
        react_said = f"{np.median(react):.0f} ({max(react)})"
        print(f"| {rule} | {first_said} ({len(first)}/{len(drifted)} runs) | {cover[29]:.3f} | "
              f"{cover[args.drift - 2]:.3f} | {react_said} | {false:.2f} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
