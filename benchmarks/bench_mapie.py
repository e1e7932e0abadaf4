"""CIC's default search against MAPIE's risk controller on the same rows: seconds and coverage.

    .venv/bin/pip install mapie==1.6.0   # benchmark-only; not part of the install
    .venv/bin/python benchmarks/bench_mapie.py [--draws 10]

MAPIE 1.6 `BinaryClassificationController(risk="precision", target_level=1 - alpha, confidence_level=1 - delta)`
(Learn-then-Test, Bonferroni–Holm over its default grid of 100 thresholds) controls the precision of "accept when
1 - U >= lambda", which is the error rate among accepted answers that `cic.calibrate` certifies for "accept when
U <= t". Both see the same calibration rows — U ~ Uniform(0, 1), P(error | U = u) = 0.05 + 0.3u, the issue's
model — at n = 10^4, 10^5, 10^6 and alpha = 0.1, 0.15, delta = 0.05, and the same model with tied scores (U
rounded up to ten values 0.1 … 1.0, as a verbalised confidence that never says 100% gives). Prints per cell the
mean seconds of one calibration, the mean coverage P(U <= t) (0 when nothing is certified) and the ratios.

MAPIE 1.6 gives a grid point that accepts no calibration answer a NaN p-value; its Holm procedure then stops at
that NaN (NaN <= level is False) and certifies nothing, though such a point only says "no evidence". The
"MAPIE, NaN → 1" column runs MAPIE's own Holm (`FWERBonferroniHolm`) with those p-values set to 1 — what a fix in
MAPIE would do, the point kept in the family and never rejected; "MAPIE as shipped" is the unpatched result, and
"NaN p-values" the share of calibrations where MAPIE produced any.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cic  # noqa: E402
from cic.reports.arena_mapie import binary_threshold, nan_safe_holm  # noqa: E402
from cic.stats.searches import DEFAULT_SEARCH  # noqa: E402

DELTA = 0.05


def mapie_version() -> str:
    """MAPIE's version, or an exit naming the install: a benchmark-only dependency."""
    try:
        import mapie
    except ImportError:
        sys.exit("MAPIE is a benchmark-only dependency: .venv/bin/pip install mapie==1.6.0")
    return str(mapie.__version__)


def mapie_threshold(scores: np.ndarray, errors: np.ndarray, alpha: float,
                    fwer: Any = "bonferroni_holm") -> float | None:
    """MAPIE's certified threshold on U (accept when U <= it), or None (`fwer`: MAPIE's own name or object)."""
    return binary_threshold(scores, errors, alpha, DELTA, fwer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=10, help="calibration sets per cell")
    args = parser.parse_args()
    print(f"MAPIE {mapie_version()} against cic.calibrate(search={DEFAULT_SEARCH!r}), delta = {DELTA}")
    print("| scores | n | α | CIC s | MAPIE s | MAPIE / CIC time | CIC coverage | MAPIE coverage, NaN → 1 | "
          "MAPIE as shipped | NaN p-values |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for ties in (False, True):
        for n in (10_000, 100_000, 1_000_000):
            for alpha in (0.10, 0.15):
                cell(rng, n, alpha, ties, args.draws)


def cell(rng: np.random.Generator, n: int, alpha: float, ties: bool, draws: int) -> None:
    """One row: `draws` calibration sets, each calibrated by CIC, by MAPIE with NaN read as 1, and as shipped."""
    times: dict[str, list[float]] = {"cic": [], "mapie": []}
    cover: dict[str, list[float]] = {"cic": [], "mapie": [], "shipped": []}
    nans = 0
    for _ in range(draws):
        u = rng.random(n)
        e = (rng.random(n) < 0.05 + 0.3 * u).astype(int)
        if ties:
            u = np.ceil(u * 10) / 10  # 0.1 ... 1.0: a stated confidence is never 100%
        start = time.perf_counter()
        t_cic = cic.calibrate(u, e, alpha=alpha, delta=DELTA, bound="cp", keep_table=False).threshold
        times["cic"].append(time.perf_counter() - start)
        holm = nan_safe_holm()
        start = time.perf_counter()
        t_mapie = mapie_threshold(u, e, alpha, holm)
        times["mapie"].append(time.perf_counter() - start)
        nans += type(holm).saw_nan
        t_shipped = mapie_threshold(u, e, alpha)
        for name, t in (("cic", t_cic), ("mapie", t_mapie), ("shipped", t_shipped)):
            cover[name].append(0.0 if t is None else float(np.mean(u <= t)))
    cic_s, mapie_s = np.mean(times["cic"]), np.mean(times["mapie"])
    print(f"| {'10 tied values' if ties else 'continuous'} | {n:,} | {alpha:g} | {cic_s:.3f} | {mapie_s:.3f} | "
          f"{mapie_s / cic_s:.1f}x | {np.mean(cover['cic']):.3f} | {np.mean(cover['mapie']):.3f} | "
          f"{np.mean(cover['shipped']):.3f} | {nans}/{draws} |", flush=True)


if __name__ == "__main__":
    main()
