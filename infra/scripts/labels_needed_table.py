"""How close "about N more labelled answers reach alpha" lands (`cic.stats.limits.labels_needed`), on laws whose
answer is known.

    python infra/scripts/labels_needed_table.py [--tables 30] [--draws 100]

Per law × alpha × table size n0: the truth is the smallest calibration size at which CIC's default search
(Clopper–Pearson, delta = 0.05) certifies in at least half of 400 sets drawn from the law itself (bisection to 2%);
each of `--tables` tables of size n0 drawn from the law gets the limits line's claim: a number (`labels_needed`, up
to RELIABLE × n0), "more than RELIABLE × n0", or "never" (no threshold on the table's score reaches alpha). Prints,
per cell, how many of each and the share correct (target: >= 80% overall): a number within a factor of 2 of the
truth; "more than" when the truth is at least half of it, or none; "never" when the truth is none.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cic.stats import limits  # noqa: E402
from cic.stats.limits import labels_needed, score_limit  # noqa: E402
from cic.stats.simulation import PowerRisk, simulate  # noqa: E402

#: (name, law, alpha): errors rising with the score at several speeds; the last one's alpha lies below every
#: threshold's risk (no amount of labels reaches it).
CASES = (
    ("linear 0-0.4", PowerRisk(0.0, 0.4, 1.0), 0.05),
    ("linear 0-0.4", PowerRisk(0.0, 0.4, 1.0), 0.1),
    ("steep 0.02-0.6, power 3", PowerRisk(0.02, 0.6, 3.0), 0.05),
    ("flat 0.05-0.3, power 0.5", PowerRisk(0.05, 0.3, 0.5), 0.1),
    ("TriviaQA-like 0.15-0.9", PowerRisk(0.15, 0.9, 1.0), 0.2),
    ("floor 0.12-0.5", PowerRisk(0.12, 0.5, 1.0), 0.1),
)
SIZES = (200, 500, 1000)
TRUTH_TRIALS = 400
MAX_N = 200_000


def truth(law: PowerRisk, alpha: float) -> int | None:
    """The smallest size certifying in half of TRUTH_TRIALS sets from the law; None when alpha < the law's floor."""
    if law.oracle_threshold(alpha) is None:
        return None

    def share(n: int) -> float:
        return 1.0 - simulate(law, n=n, alpha=alpha, n_trials=TRUTH_TRIALS, seed=11).fails / TRUTH_TRIALS

    lo, hi = 1, 64
    while share(hi) < 0.5:
        lo, hi = hi, hi * 2
        if hi > MAX_N:
            return None
    while hi - lo > max(1, hi // 50):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if share(mid) >= 0.5 else (mid, hi)
    return hi


def claim(u: np.ndarray, e: np.ndarray, alpha: float, draws: int) -> tuple[str, int | None]:
    """What the limits line claims for one table: ("number", N), ("more than", RELIABLE·n0) or ("never", None)."""
    if score_limit(u, e, alpha) == 0.0:
        return "never", None
    x = labels_needed(u, e, alpha=alpha, draws=draws, seed=1)
    return ("number", x) if x is not None else ("more than", limits.RELIABLE * u.shape[0])


def correct(kind: str, value: int | None, real: int | None) -> bool:
    """A number within 2× of the truth; "more than R·n0" when the truth is at least half that (the same 2×
    tolerance) or none; "never" when no size reaches alpha."""
    if kind == "never":
        return real is None
    if kind == "more than":
        return real is None or real >= value / 2
    return real is not None and real / 2 <= value <= 2 * real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=30, help="tables drawn per cell")
    parser.add_argument("--draws", type=int, default=100, help="draws per size inside labels_needed")
    parser.add_argument("--reliable", type=int, default=limits.RELIABLE, help="numbers up to this many times the "
                        "table (limits.RELIABLE), to measure another choice")
    args = parser.parse_args()
    limits.RELIABLE = args.reliable
    started = time.perf_counter()
    print(f"| law | α | truth (labels) | n0 | numbers given | median number | \"more than {args.reliable}×\" | never | "
          "claim correct | number within 2× |")
    print("|---|---|---|---|---:|---|---:|---:|---|---|")
    hits = total = number_hits = numbers = 0
    rng = np.random.default_rng(0)
    for name, law, alpha in CASES:
        real = truth(law, alpha)
        for n0 in SIZES:
            claims = []
            for _ in range(args.tables):
                u, e = law.sample(rng, (1, n0))
                claims.append(claim(u[0], e[0], alpha, args.draws))
            good = [correct(kind, value, real) for kind, value in claims]
            given = [value for kind, value in claims if kind == "number"]
            close = [correct("number", value, real) for value in given]
            hits, total = hits + sum(good), total + len(good)
            number_hits, numbers = number_hits + sum(close), numbers + len(given)
            median = f"{int(np.median(given)):,}" if given else "—"
            print(f"| {name} | {alpha:g} | {'none' if real is None else f'{real:,}'} | {n0:,} | {len(given)} | "
                  f"{median} | {sum(k == 'more than' for k, _ in claims)} | {sum(k == 'never' for k, _ in claims)} | "
                  f"{np.mean(good):.0%} | {f'{np.mean(close):.0%}' if close else '—'} |", flush=True)
    verdict = "met" if hits / total >= 0.8 else "not met"
    elapsed = time.perf_counter() - started
    print(f"\nClaims correct: {hits}/{total} = {hits / total:.0%} (target >= 80%: {verdict}); numbers within 2× of the "
          f"truth: {number_hits}/{numbers} = {number_hits / max(numbers, 1):.0%}; {elapsed:.0f} s.")


if __name__ == "__main__":
    main()
