"""A risk-control arena: frozen (score, error) tables against the abstention methods a team would reach for, split
by split, with the probability that the error rate among answered questions exceeds α beside the mean.

Each split (seeded, `cic.split_masks`) calibrates every method on one part and judges it on the rest: coverage
(accepted / test questions), the FDR of the accepted test answers (0 when none), P(FDR > α) over the splits, the
share of splits that accept nothing, and seconds per calibration. A method is one `Method` entry: its name, the
kind of guarantee it carries, and its rule (calibration scores and errors, test scores, α, δ → accepted test
questions). MAPIE's controllers join where MAPIE is installed (`cic.reports.arena_mapie`; not a CIC dependency).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cic.errors import UserError
from cic.registry import Registry

if TYPE_CHECKING:
    import polars as pl

Rule = Callable[[np.ndarray, np.ndarray, np.ndarray, float, float], np.ndarray]
PAC = "PAC (1 − δ)"
EXPECTATION = "in expectation"


@dataclass(frozen=True)
class Method:
    """One abstention method of the arena: what it guarantees and how it accepts test questions."""

    name: str
    guarantee: str
    rule: Rule
    description: str
    estimators: tuple[str, ...] = ()  # the scores it applies to (empty: every score)


def _threshold_rule(search: str, bound: str, grid: bool = False) -> Rule:
    """CIC's `calibrate` with this search and bound: accept the test questions at or below its threshold."""
    def accepts(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, delta: float) -> np.ndarray:
        from cic.stats.calibration import calibrate, uniform_grid

        points = uniform_grid(float(u.min()), float(u.max()), 100) if grid and u.max() > u.min() else None
        t = calibrate(u, e, alpha=alpha, delta=delta, bound=bound, search=search, grid=points,
                      keep_table=False).threshold
        return np.zeros(test.shape, dtype=bool) if t is None else test <= t
    return accepts


def score_select(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, delta: float) -> np.ndarray:
    """Conformal selection (Jin & Candès 2023): p_j = (1 + #{wrong calibration answers with U ≤ U_j}) / (n + 1),
    Benjamini–Hochberg at α over the test questions: FDR ≤ α in expectation (δ unused)."""
    wrong = np.sort(u[e == 1])
    p = (1 + np.searchsorted(wrong, test, side="right")) / (u.shape[0] + 1)
    order = np.argsort(p, kind="stable")
    m = test.shape[0]
    passed = np.flatnonzero(p[order] <= alpha * np.arange(1, m + 1) / m)
    accepted = np.zeros(m, dtype=bool)
    if passed.size:
        accepted[order[:passed[-1] + 1]] = True
    return accepted


METHODS: Registry[Method] = Registry("arena method", (
    Method("cic", PAC, _threshold_rule("fallback", "cp"), "CIC's default: fallback search, Clopper–Pearson"),
    Method("cic-hoeffding", PAC, _threshold_rule("fallback", "hoeffding"), "the default search, Hoeffding"),
    Method("bonferroni-grid", PAC, _threshold_rule("bonferroni", "cp", grid=True),
           "Bonferroni over 100 thresholds spread over the calibration scores' range (label-free), Clopper–Pearson"),
    Method("lec", EXPECTATION, _threshold_rule("lec", "cp"),
           "LEC: the largest threshold with Σ(error − α) ≤ −1 over accepted calibration answers"),
    Method("score-select", EXPECTATION, score_select,
           "conformal selection: conformal p-values of 'wrong', Benjamini–Hochberg at α"),
))


def _mapie(rule: str) -> Rule:
    def accepts(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, delta: float) -> np.ndarray:
        from cic.reports import arena_mapie

        return getattr(arena_mapie, rule)(u, e, test, alpha, delta)
    return accepts


def _register_mapie() -> None:
    from cic.reports.arena_mapie import installed

    if installed():
        METHODS.register(Method("mapie-binary", PAC, _mapie("binary"), "MAPIE 1.6 BinaryClassificationController, "
                                "precision, Holm over its 100-point grid (NaN p-values read as 1)"))
        METHODS.register(Method("mapie-multiclass", PAC, _mapie("multiclass"), "MAPIE 1.6 "
                                "MultiClassificationLTTController on the top option, the λ that abstains least",
                                estimators=("one_minus_max_prob",)))


_register_mapie()


def run_arena(frame: pl.DataFrame, *, alphas: Sequence[float], deltas: Sequence[float] = (0.05,),
              methods: Sequence[str] | None = None, n_splits: int = 500, cal_fraction: float = 0.5,
              seed: int = 0) -> pl.DataFrame:
    """One row per (group, method, α, δ) of a long (score, error) frame: coverage, mean FDR, P(FDR > α), the share
    of splits accepting nothing, seconds per calibration, the guarantee kind, and — when the frame has the
    `generations` column — what the score cost, in generations a question (every question is scored, whatever
    the method then accepts; null without the column)."""
    import polars as pl

    from cic.stats._validation import check_open_unit
    from cic.stats.protocol import split_masks
    from cic.store.score_files import COST_COLUMN, GROUP_KEYS, check_long_frame

    chosen = [METHODS.lookup(m) for m in (methods or list(METHODS))]
    for a in alphas:
        check_open_unit(a, "alpha")
    for d in deltas:
        check_open_unit(d, "delta")
    check_open_unit(cal_fraction, "cal_fraction")
    if not 1 <= n_splits <= 100_000:
        raise UserError(f"n_splits = {n_splits}: must be between 1 and 100,000")
    frame = check_long_frame(frame)
    rows = []
    for key, part in frame.group_by(list(GROUP_KEYS), maintain_order=True):
        u = part.get_column("score").to_numpy()
        e = part.get_column("error").to_numpy().astype(np.int64)
        masks = split_masks(u.shape[0], n_splits, cal_fraction, seed)
        cost = float(part.get_column(COST_COLUMN).mean()) if COST_COLUMN in part.columns else None
        for alpha in alphas:
            for delta in deltas:
                for method in chosen:
                    if method.estimators and key[2] not in method.estimators:
                        continue
                    rows.append({**dict(zip(GROUP_KEYS, key, strict=True)), "method": method.name,
                                 "guarantee": method.guarantee, "alpha": float(alpha), "delta": float(delta),
                                 **_judge(method, u, e, masks, float(alpha), float(delta)),
                                 "generations_per_question": cost})
    return pl.DataFrame(rows, schema_overrides={"generations_per_question": pl.Float64})


def _judge(method: Method, u: np.ndarray, e: np.ndarray, masks: np.ndarray, alpha: float,
           delta: float) -> dict[str, float]:
    coverage, fdr, seconds = (np.zeros(masks.shape[0]) for _ in range(3))
    for i, cal in enumerate(masks):
        start = time.perf_counter()
        accepted = method.rule(u[cal], e[cal], u[~cal], alpha, delta)
        seconds[i] = time.perf_counter() - start
        coverage[i] = accepted.mean()
        fdr[i] = e[~cal][accepted].mean() if accepted.any() else 0.0
    return {"coverage": float(coverage.mean()), "mean_fdr": float(fdr.mean()),
            "p_fdr_above_alpha": float((fdr > alpha).mean()), "accepts_nothing": float((coverage == 0).mean()),
            "seconds": float(seconds.mean()), "splits": int(masks.shape[0])}


def arena_markdown(rows: pl.DataFrame) -> str:
    """The arena as one Markdown table: a row per group, α, δ and method."""
    lines = ["| model | dataset | estimator | criterion | α | δ | method | guarantee | coverage | mean FDR | "
             "P(FDR > α) | accepts nothing | ms per calibration | generations / question |", "|---" * 14 + "|"]
    for r in rows.iter_rows(named=True):
        cost = "—" if r.get("generations_per_question") is None else f"{r['generations_per_question']:.2f}"
        lines.append(f"| {r['model']} | {r['dataset']} | {r['estimator']} | {r['criterion']} | {r['alpha']:g} | "
                     f"{r['delta']:g} | {r['method']} | {r['guarantee']} | {r['coverage']:.3f} | {r['mean_fdr']:.3f} | "
                     f"{r['p_fdr_above_alpha']:.3f} | {r['accepts_nothing']:.3f} | {r['seconds'] * 1e3:.1f} | {cost} |")
    return "\n".join(lines) + "\n"


FIGURE_GROUPS = 8  # groups drawn (the table and the CSV hold every one)


def arena_figure(rows: pl.DataFrame, path: Path) -> Path:
    """Per group (the first `FIGURE_GROUPS`; δ the first of the run): coverage and P(FDR > α) against α, a line
    per method, δ dashed — or, with one α, a bar per method. The legend wraps into as many rows as its labels need
    to stay inside the figure."""
    from cic.reports.figures import _figure, _save, _shared_legend, _title, legend_layout
    from cic.store.score_files import GROUP_KEYS

    delta = float(rows.get_column("delta")[0])
    rows = rows.filter(delta=delta)
    groups = rows.select(GROUP_KEYS).unique(maintain_order=True).rows()[:FIGURE_GROUPS]
    methods = rows.select("method", "guarantee").unique(maintain_order=True).rows()
    labels = [f"{name} ({guarantee})" for name, guarantee in methods]
    width = max(7.0, 0.65 + 0.15 + 2 * 3.6 + 0.65)
    cols, lines = legend_layout(labels, width)
    one_alpha = rows.get_column("alpha").n_unique() == 1
    fig, axes = _figure(2 * len(groups), max_cols=2, top_in=0.6 + 0.2 * lines, min_width=width,
                        bottom_in=1.1 if one_alpha else 0.5)  # one α: the methods' names under the bars
    colours = [f"C{i % 10}" for i in range(len(methods))]
    handles = []
    for g, key in enumerate(groups):
        part = rows.filter(**dict(zip(GROUP_KEYS, key, strict=True)))
        cover, above = axes[2 * g], axes[2 * g + 1]
        for m, (name, _) in enumerate(methods):
            line = part.filter(method=name).sort("alpha")
            if one_alpha:  # a dot per method on a 0.19-0.21 axis says nothing: bars side by side
                drawn = cover.bar(m, line["coverage"][0] if line.height else 0.0, color=colours[m])
                above.bar(m, line["p_fdr_above_alpha"][0] if line.height else 0.0, color=colours[m])
            else:
                drawn, = cover.plot(line["alpha"], line["coverage"], marker="o", ms=3, lw=1.2, color=colours[m])
                above.plot(line["alpha"], line["p_fdr_above_alpha"], marker="o", ms=3, lw=1.2, color=colours[m])
            if g == 0:
                handles.append(drawn)
        above.axhline(delta, ls="--", lw=0.8, color="0.4")
        at = f" at α = {rows.get_column('alpha')[0]:g}" if one_alpha else ""
        _title(cover, f"{key[1]} · {key[2]}: coverage{at}", 8)
        _title(above, f"{key[1]} · {key[2]}: P(FDR > α){at}", 8)
        for ax in (cover, above):
            if one_alpha:
                ax.set_xticks(range(len(methods)), [name for name, _ in methods], rotation=30, ha="right")
            else:
                ax.set_xlabel("α", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_ylim(-0.02, 1.02)
    _shared_legend(fig, handles, labels, f"Risk-control arena ({rows.get_column('splits')[0]} splits, δ = {delta:g}; "
                                         "dashed: δ)", ncols=cols)
    return _save(fig, path)
