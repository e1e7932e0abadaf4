"""Why an accuracy probe is fitted on questions it is never certified on: a simulation, with and without the split.

    .venv/bin/python infra/scripts/probe_validity_table.py [--draws 200]

Hidden states: p = 200 standard normal features, of which 5 carry the signal of a wrong answer (base error
~0.45). Per draw: 300 fit questions, 300 calibration questions, 20,000 fresh ones. The probe (`cic.llm.probes`,
logistic regression, C = 10) is fitted either on the calibration questions themselves (what the store refuses) or
on the disjoint fit split; `cic.calibrate` (cp, fixed_sequence, delta 0.05) certifies a threshold on the
calibration questions; a violation is an error rate above alpha among the fresh questions it accepts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cic  # noqa: E402
from cic.llm.probes import fit_probe  # noqa: E402

P, SIGNAL, N_FIT, N_CAL, N_TEST, DELTA = 200, 3.0, 300, 300, 20_000, 0.05


def world(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, P))
    w = np.zeros(P)
    w[:5] = SIGNAL / np.sqrt(5)
    return x, (rng.random(n) < 1 / (1 + np.exp(-(x @ w - 0.4)))).astype(int)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    print(f"{args.draws} draws; p = {P}; {N_FIT} fit / {N_CAL} calibration / {N_TEST:,} fresh questions; cp, "
          f"fixed_sequence, delta {DELTA}")
    print()
    print("| alpha | probe fitted on | violations (share of draws) | mean coverage on fresh questions | "
          "mean error among them, where any |")
    print("|---:|---|---:|---:|---:|")
    for alpha in (0.2, 0.25, 0.3):
        rng = np.random.default_rng(0)
        arms = {"the calibration questions (refused)": [], "a disjoint fit split": []}
        for _ in range(args.draws):
            x, e = world(rng, N_FIT + N_CAL + N_TEST)
            cal, test = slice(N_FIT, N_FIT + N_CAL), slice(N_FIT + N_CAL, None)
            for arm, rows in (("the calibration questions (refused)", cal), ("a disjoint fit split",
                                                                             slice(0, N_FIT))):
                ids = [str(i) for i in range(x[rows].shape[0])]
                probe = fit_probe("accuracy", x[rows], e[rows], ids, model="sim", layers=(-1,),
                                  positions=("answer",), target_name="sim", grid=(10.0,))
                result = cic.calibrate(probe.score(x[cal]), e[cal], alpha=alpha, delta=DELTA,
                                       search="fixed_sequence")
                accepted = probe.score(x[test]) <= result.threshold if result.threshold is not None else None
                share = float(accepted.mean()) if accepted is not None else 0.0
                error = float(e[test][accepted].mean()) if accepted is not None and accepted.any() else None
                arms[arm].append((error is not None and error > alpha, share, error))
        for arm, rows in arms.items():
            errors = [r[2] for r in rows if r[2] is not None]
            shown = f"{np.mean(errors):.3f} ({len(errors)} draws answer any)" if errors else "— (none answers)"
            print(f"| {alpha} | {arm} | {np.mean([r[0] for r in rows]):.3f} | {np.mean([r[1] for r in rows]):.3f} "
                  f"| {shown} |")


if __name__ == "__main__":
    main()
