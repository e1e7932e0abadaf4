"""Judge plus people in simulation: how often the prediction-powered certificate (`cic.calibrate_judged`) misses,
and what it answers against the people's labels alone.

    .venv/bin/python infra/scripts/judged_validity_table.py [--trials 300] [--alpha 0.2]

Each trial draws 2,000 questions from a law with known risk (`PowerRisk`: the people's verdict is the truth), a
judge's verdict on all of them, and people's labels on a random 200. Judges: agreeing with people 90% or 97% of
the time (symmetric flips); lenient where the score is high (misses errors more often the higher the score, the
judge is then optimistic exactly where the threshold lands); harsh (calls 15% of right answers wrong). Columns:
violations of the people's risk (R(t̂) > alpha) for the judge-plus-people gate, the people-only gate on the 200,
and — to show why the correction is needed — a gate certified on the judge's labels as if they were the truth;
mean coverage of each, of people's labels on all 2,000 (what a full labelling would buy), and the ratio
judge-plus-people / people alone (target ≥ 1.5 at 90% agreement, alpha 0.2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402
from cic.stats.simulation import PowerRisk, binomial_ci  # noqa: E402

DELTA = 0.05
N_JUDGED, N_PEOPLE = 2000, 200
LAWS = {"linear 0→0.5": PowerRisk(0.0, 0.5, 1.0), "steep 0.02→0.6 (u³)": PowerRisk(0.02, 0.6, 3.0),
        "flat 0.1→0.3": PowerRisk(0.1, 0.3, 1.0)}
Judge = Callable[[np.random.Generator, np.ndarray, np.ndarray], np.ndarray]


def flips(rate: float) -> Judge:
    """A judge that disagrees with people on a share `rate` of the questions, at random."""
    return lambda rng, u, wrong: np.where(rng.random(u.shape[0]) < rate, 1 - wrong, wrong)


def lenient_high(rng: np.random.Generator, u: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """Misses a wrong answer with probability 0.6·u (score u in [0, 1]); calls 2% of right answers wrong."""
    miss = rng.random(u.shape[0]) < 0.6 * u
    false_alarm = rng.random(u.shape[0]) < 0.02
    return np.where(wrong == 1, (~miss).astype(int), false_alarm.astype(int))


def harsh(rng: np.random.Generator, u: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """Never misses a wrong answer; calls 15% of right answers wrong."""
    return np.where(wrong == 1, 1, (rng.random(u.shape[0]) < 0.15).astype(int))


JUDGES: dict[str, Judge] = {"agrees 90%": flips(0.10), "agrees 97%": flips(0.03), "lenient where score high":
                            lenient_high, "harsh": harsh}


def trial(law: PowerRisk, judge: Judge, rng: np.random.Generator, alpha: float, n_judged: int,
          n_people: int) -> dict[str, tuple[float, float]]:
    """One calibration set; per gate (true coverage, true risk) of its threshold (0, 0 when nothing is certified)."""
    u = rng.random(n_judged)
    wrong = (rng.random(n_judged) < law.conditional_risk(u)).astype(int)
    verdict = judge(rng, u, wrong)
    people = rng.permutation(n_judged)[:n_people]
    human = np.full(n_judged, np.nan)
    human[people] = wrong[people]
    gates = {"judge+people": cic.calibrate_judged(u, verdict, human, alpha=alpha, delta=DELTA).threshold,
             "people alone": cic.calibrate(u[people], wrong[people], alpha=alpha, delta=DELTA).threshold,
             "judge as truth": cic.calibrate(u, verdict, alpha=alpha, delta=DELTA).threshold,
             "people on all": cic.calibrate(u, wrong, alpha=alpha, delta=DELTA).threshold}
    return {k: (0.0, 0.0) if t is None else (float(law.acceptance(np.array(t))), float(law.selection_risk(np.array(t))))
            for k, t in gates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--alpha", type=float, default=0.2)
    parser.add_argument("--judged", type=int, default=N_JUDGED, help="questions the judge labels")
    parser.add_argument("--people", type=int, default=N_PEOPLE, help="of them, labelled by people at random")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"alpha = {args.alpha}, delta = {DELTA}, {args.judged} judged questions, {args.people} labelled by people, "
          f"{args.trials} trials per row; violations: share of trials with people's risk R(t̂) > alpha (CP upper)")
    print()
    print(f"| law | judge | violations judge+people | people alone | judge as truth | coverage judge+people | "
          f"people alone ({args.people}) | people on all ({args.judged}) | ratio |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for law_name, law in LAWS.items():
        for judge_name, judge in JUDGES.items():
            rows = [trial(law, judge, rng, args.alpha, args.judged, args.people) for _ in range(args.trials)]

            def violations(key: str, rows: list[dict[str, tuple[float, float]]] = rows) -> str:
                bad = sum(r[key][1] > args.alpha for r in rows)
                return f"{bad / args.trials:.3f} (≤ {binomial_ci(bad, args.trials, 0.95)[1]:.3f})"

            cover = {k: float(np.mean([r[k][0] for r in rows])) for k in rows[0]}
            ratio = cover["judge+people"] / cover["people alone"] if cover["people alone"] > 0 else float("nan")
            print(f"| {law_name} | {judge_name} | {violations('judge+people')} | {violations('people alone')} | "
                  f"{violations('judge as truth')} | {cover['judge+people']:.3f} | {cover['people alone']:.3f} | "
                  f"{cover['people on all']:.3f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
