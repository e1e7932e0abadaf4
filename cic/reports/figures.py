"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state).

matplotlib is imported inside each function, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.reports.tables import bound_label, ratio_label, varying_keys

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure

DPI = 100


def _figure(n_panels: int, *, panel_size: tuple[float, float] = (3.6, 2.8), max_cols: int = 4,
            top_in: float = 0.6, min_width: float = 0.0, labels: tuple[str, str] | None = None,
            bottom_in: float = 0.5) -> tuple[Figure, list[Any]]:
    """A grid of panels with fixed margins in inches (matplotlib's automatic layouts cost seconds on big grids).

    `top_in` leaves room above the panels for a title and a shared legend (`bottom_in` below them for tick labels);
    `min_width` (inches) keeps that
    text inside a figure of few panels, which then sit centred. With `labels` (x, y) the panels share their
    axes and only the outer ones carry tick labels and axis labels (less text to draw, easier to compare).
    """
    from matplotlib.figure import Figure

    cols = max(1, min(max_cols, n_panels))
    rows = math.ceil(n_panels / cols)
    left, right, bottom, gap_w, gap_h = 0.65, 0.15, bottom_in, 0.65, 0.75
    natural = left + right + cols * panel_size[0] + (cols - 1) * gap_w
    width = max(natural, min_width)
    left, right = left + (width - natural) / 2, right + (width - natural) / 2
    height = top_in + bottom + rows * panel_size[1] + (rows - 1) * gap_h
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top_in / height,
                        wspace=gap_w / panel_size[0], hspace=gap_h / panel_size[1])
    shared = labels is not None
    axes = fig.subplots(rows, cols, squeeze=False, sharex=shared, sharey=shared).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    if labels is not None:
        for i, ax in enumerate(axes[:n_panels]):
            bottom_of_column = i + cols >= n_panels
            ax.tick_params(labelbottom=bottom_of_column, labelleft=i % cols == 0)
            if bottom_of_column:
                ax.set_xlabel(labels[0])
            if i % cols == 0:
                ax.set_ylabel(labels[1])
    return fig, axes[:n_panels]


LEGEND_CHAR_IN = 0.062  # inches per character of a 7-point legend label (DejaVu Sans), with its marker beside it
LEGEND_ENTRY_IN = 0.55


def legend_layout(labels: list[str], width_in: float) -> tuple[int, int]:
    """(columns, rows) of a shared legend whose widest column of labels fits `width_in` (less a margin)."""
    if not labels:
        return 1, 0
    entry = LEGEND_ENTRY_IN + LEGEND_CHAR_IN * max(map(len, labels))
    cols = max(1, min(len(labels), 7, int((width_in - 0.3) // entry)))
    return cols, math.ceil(len(labels) / cols)


def _shared_legend(fig: Figure, handles: list[Any], labels: list[str], title: str | None = None,
                   ncols: int | None = None) -> None:
    """One legend for every panel, centred under the figure title (`ncols`: as `legend_layout` fits them)."""
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.12 / fig.get_figheight())
    fig.legend(handles, labels, loc="upper center", ncols=ncols or min(len(labels), 7), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.32 / fig.get_figheight()))


def _title(ax: Any, text: str, size: int = 9) -> None:
    """A panel title at a fixed height (matplotlib's automatic title placement measures every tick label)."""
    ax.set_title(text, fontsize=size, y=1.0)


def _save(fig: Figure, path: Path) -> Path:
    from cic.store.outputs import atomic_output

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, "figure") as partial:
        fig.savefig(partial, dpi=DPI, format=path.suffix.lstrip(".") or "png")
    return path


@dataclass(frozen=True)
class CurvePanel:
    """One risk–coverage panel: the curve and, per alpha, the certified threshold's (coverage, risk) or None."""

    title: str
    coverage: Sequence[float]
    risk: Sequence[float]
    marks: Sequence[tuple[float, tuple[float, float] | None]]


def risk_coverage_figure(panels: Sequence[CurvePanel], path: Path, title: str) -> Path:
    """Selective risk against coverage, with each alpha's certified threshold marked (× where unattainable)."""
    from matplotlib.lines import Line2D

    fig, axes = _figure(len(panels), top_in=0.9, min_width=9.0,
                        labels=("coverage (accepted share)", "error rate among accepted"))
    alphas = [alpha for alpha, _ in panels[0].marks] if panels else []
    colors = dict(zip(alphas, _palette(len(alphas)), strict=True))
    for ax, panel in zip(axes, panels, strict=True):
        step = max(1, len(panel.coverage) // 600)  # a few hundred points draw the same line
        ax.plot(panel.coverage[::step], panel.risk[::step], color="0.3", lw=1.2)
        for alpha, point in panel.marks:
            ax.axhline(alpha, color=colors[alpha], lw=0.6, ls=":")
            if point is None:
                ax.plot([0.0], [alpha], marker="x", color=colors[alpha], ms=7, ls="none")
            else:
                ax.plot([point[0]], [point[1]], marker="o", color=colors[alpha], ms=6, ls="none")
        _title(ax, panel.title)
        ax.set_xlim(0, 1.02)
        ax.set_ylim(bottom=0)
    handles = [Line2D([], [], color="0.3", lw=1.2)] + [
        Line2D([], [], color=colors[a], marker="o", ls=":", lw=0.6) for a in alphas] + [
        Line2D([], [], color="0.3", marker="x", ls="none")]
    labels = ["empirical risk"] + [f"certified, α = {a:g}" for a in alphas] + ["unattainable"]
    _shared_legend(fig, handles, labels, title)
    return _save(fig, path)


def fdr_vs_alpha_figure(results: pl.DataFrame, path: Path) -> Path:
    """Mean test FDR (± std over splits) against alpha per group, one panel per bound, with the line y = alpha."""
    return _metric_vs_alpha_figure(results, path, "fdr", "test FDR (mean ± std)", diagonal=True)


def coverage_vs_alpha_figure(results: pl.DataFrame, path: Path) -> Path:
    """Mean coverage (the paper's power, ± std over splits) against alpha per group, one panel per bound."""
    return _metric_vs_alpha_figure(results, path, "coverage", "coverage (mean ± std)", diagonal=False)


def curve_keys(results: pl.DataFrame) -> list[str]:
    """The columns that make one line of a metric-against-α panel: the group columns that vary and the search
    when several are shown (else two searches' points were drawn as one zig-zag line under one legend entry)."""
    keys = varying_keys(results)
    if "search" in results.columns and results.get_column("search").n_unique() > 1 and "search" not in keys:
        keys = [*keys, "search"] if results.select(keys).n_unique() > 1 else ["search"]
    return keys


def _metric_vs_alpha_figure(results: pl.DataFrame, path: Path, metric: str, ylabel: str, *,
                            diagonal: bool) -> Path:
    keys = curve_keys(results)
    bounds = list(dict.fromkeys(results.get_column("bound").to_list()))
    groups = list(dict.fromkeys(tuple(r[k] for k in keys) for r in results.iter_rows(named=True)))
    names = [" / ".join(group) or "all" for group in groups] + (["y = α"] if diagonal else [])
    panels = min(2, len(bounds))
    legend_cols, legend_rows = legend_layout(names, 0.65 + 0.15 + panels * 4.4 + (panels - 1) * 0.65)
    fig, axes = _figure(len(bounds), panel_size=(4.4, 3.4), max_cols=2, top_in=0.5 + 0.2 * legend_rows,
                        labels=("target risk level α", ylabel))
    colors = _palette(len(groups))
    top = float(results.get_column("alpha").max())
    for ax, bound in zip(axes, bounds, strict=True):
        if diagonal:
            ax.plot([0, top * 1.05], [0, top * 1.05], color="k", ls="--", lw=1, label="y = α")
        sub = results.filter(bound=bound).sort("alpha")
        drawn = 0
        for group, color in zip(groups, colors, strict=True):
            rows = [r for r in sub.iter_rows(named=True) if tuple(r[k] for k in keys) == group
                    and r[f"{metric}_mean"] is not None and (metric != "fdr" or r["fails"] < r["n_splits"])]
            if rows:
                drawn += 1
                ax.errorbar([r["alpha"] for r in rows], [r[f"{metric}_mean"] for r in rows],
                            yerr=[r[f"{metric}_std"] for r in rows], marker="o", ms=3, lw=1, capsize=2,
                            color=color, label=" / ".join(group) or "all")
        if not drawn or (metric == "coverage" and all(r["fails"] == r["n_splits"] for r in sub.iter_rows(named=True))):
            ax.text(0.5, 0.5, "nothing certified: every split was\nunattainable at every α", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8, color="0.3")
        _title(ax, f"{bound_label(bound)} (search {', '.join(sorted(set(sub['search'])))})")
        ax.set_xlim(0, top * 1.05)
        ax.set_ylim(0, top * 1.05 if diagonal else 1.02)
    entries = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    _shared_legend(fig, list(entries.values()), list(entries), ncols=legend_cols)  # a group's colour in every panel
    return _save(fig, path)


def sensitivity_figure(frame: pl.DataFrame, path: Path) -> Path:
    """Alignment proportion (1 − test FDR) against the calibration:test ratio, target 1 − alpha dashed.

    One panel per group and alpha, one line per bound — the layout of the paper's Figure 2.
    """
    from matplotlib.lines import Line2D

    keys = varying_keys(frame)
    panels = list(dict.fromkeys((tuple(r[k] for k in keys), r["alpha"]) for r in frame.iter_rows(named=True)))
    fig, axes = _figure(len(panels), panel_size=(3.8, 3.0), max_cols=3, top_in=0.9, min_width=6.5,
                        labels=("calibration : test split ratio", "alignment proportion (1 − FDR)"))
    fractions = sorted(set(frame.get_column("cal_fraction").to_list()), reverse=True)
    bounds = list(dict.fromkeys(frame.get_column("bound").to_list()))
    colors = dict(zip(bounds, _palette(len(bounds)), strict=True))
    for ax, (group, alpha) in zip(axes, panels, strict=True):
        sub = [r for r in frame.iter_rows(named=True) if tuple(r[k] for k in keys) == group and r["alpha"] == alpha]
        for bound in bounds:
            pts = {r["cal_fraction"]: r for r in sub if r["bound"] == bound and r["fdr_mean"] is not None}
            xs = [i for i, f in enumerate(fractions) if f in pts]
            if xs:
                ax.errorbar(xs, [1 - pts[fractions[i]]["fdr_mean"] for i in xs],
                            yerr=[pts[fractions[i]]["fdr_std"] for i in xs], marker="o", ms=4, lw=1.2, capsize=3,
                            color=colors[bound])
        ax.axhline(1 - alpha, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(fractions)), [ratio_label(f) for f in fractions])
        _title(ax, f"{' / '.join(group)}, target {1 - alpha:.2f}")
    handles = [Line2D([], [], color=colors[b], marker="o") for b in bounds] + [Line2D([], [], color="k", ls="--")]
    labels = [bound_label(b) for b in bounds] + ["target 1 − α"]
    _shared_legend(fig, handles, labels, "Sensitivity to the calibration:test split ratio (mean ± std over splits)")
    return _save(fig, path)


def budget_figure(frame: pl.DataFrame, path: Path) -> Path:
    """The label-budget curve: certified coverage against calibration size (log scale), a line per alpha and its
    score's limit dashed in the same colour — one panel per group."""
    from matplotlib.lines import Line2D

    keys = varying_keys(frame)
    groups = list(dict.fromkeys(tuple(r[k] for k in keys) for r in frame.iter_rows(named=True)))
    fig, axes = _figure(len(groups), panel_size=(3.8, 3.0), max_cols=3, top_in=0.9, min_width=6.5,
                        labels=("labelled calibration answers", "certified coverage"))
    alphas = sorted(set(frame.get_column("alpha").to_list()))
    colors = dict(zip(alphas, _palette(len(alphas)), strict=True))
    for ax, group in zip(axes, groups, strict=True):
        rows = [r for r in frame.iter_rows(named=True) if tuple(r[k] for k in keys) == group]
        for alpha in alphas:
            pts = sorted((r["labels"], r["coverage"], r["score_limit"]) for r in rows if r["alpha"] == alpha)
            if pts:
                ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", ms=3, lw=1.2,
                        color=colors[alpha])
                ax.axhline(pts[0][2], color=colors[alpha], ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        _title(ax, " / ".join(group) or "all")
    handles = [Line2D([], [], color=colors[a], marker="o") for a in alphas] + [Line2D([], [], color="k", ls="--")]
    labels = [f"α = {a:g}" for a in alphas] + ["the score's limit (in-sample)"]
    _shared_legend(fig, handles, labels, "Label budget: certified coverage against labels (the table read as a law)")
    return _save(fig, path)


def prr_figure(frame: pl.DataFrame, path: Path) -> Path:
    """Prediction rejection ratio per estimator (bars), grouped by the other group columns."""
    others = [k for k in varying_keys(frame) if k != "estimator"]
    estimators = list(dict.fromkeys(frame.get_column("estimator").to_list()))
    groups = list(dict.fromkeys(tuple(r[k] for k in others) for r in frame.iter_rows(named=True))) or [()]
    from matplotlib.figure import Figure

    if len(groups) == 1:  # one model, dataset and criterion: a named bar per estimator, no legend over the bars
        fig = Figure(figsize=(max(4.5, 1.2 + 0.5 * len(estimators)), 4.6))
        ax = fig.add_subplot()
        fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=0.98, top=0.9, bottom=0.4)
        values = [next((r["prr"] for r in frame.iter_rows(named=True) if r["estimator"] == est), None) or 0.0
                  for est in estimators]
        ax.bar(range(len(estimators)), values, 0.7, color=_palette(len(estimators)))
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(estimators)), estimators, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("PRR (1 = perfect, 0 = random)")
        _title(ax, f"Prediction rejection ratio per estimator{' · ' + ' / '.join(groups[0]) if groups[0] else ''}",
               10)
        return _save(fig, path)
    fig = Figure(figsize=(max(4.5, 1.0 + 0.55 * len(groups) * max(1, len(estimators))), 3.8))
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.22)
    width = 0.8 / len(estimators)
    for j, (est, color) in enumerate(zip(estimators, _palette(len(estimators)), strict=True)):
        values = []
        for group in groups:
            hit = [r["prr"] for r in frame.iter_rows(named=True)
                   if r["estimator"] == est and tuple(r[k] for k in others) == group]
            values.append(hit[0] if hit and hit[0] is not None else 0.0)
        ax.bar([i + (j - (len(estimators) - 1) / 2) * width for i in range(len(groups))], values, width,
               color=color, label=est)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(groups)), [" / ".join(g) if g else "all" for g in groups], rotation=20, ha="right",
                  fontsize=8)
    ax.set_ylabel("PRR (1 = perfect, 0 = random)")
    _title(ax, "Prediction rejection ratio per estimator", 10)
    ax.legend(fontsize=7)
    return _save(fig, path)


def validity_figure(frame: pl.DataFrame, path: Path) -> Path:
    """Violation rate with its exact 95% interval against n, per search × bound; panels scenario × alpha."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    panels = list(dict.fromkeys((r["scenario"], r["alpha"]) for r in frame.iter_rows(named=True)))
    fig, axes = _figure(len(panels), panel_size=(4.0, 3.0), max_cols=2, top_in=1.0, min_width=9.0)
    series = list(dict.fromkeys((r["search"], r["bound"]) for r in frame.iter_rows(named=True)))
    colors = _palette(len(series))
    delta = float(frame.get_column("delta")[0])
    for ax, (scenario, alpha) in zip(axes, panels, strict=True):
        sub = frame.filter(scenario=scenario, alpha=alpha)
        ns = sorted(set(sub.get_column("n").to_list()))
        for k, ((search, bound), color) in enumerate(zip(series, colors, strict=True)):
            rows = sub.filter(search=search, bound=bound).sort("n")
            if rows.height == 0:
                continue
            shift = 1 + 0.04 * (k - (len(series) - 1) / 2)  # spread the series on the log axis
            xs = [n * shift for n in rows["n"].to_list()]
            rate = rows["violation_rate"].to_numpy()
            ax.errorbar(xs, rate, yerr=[rate - rows["ci_low"].to_numpy(), rows["ci_high"].to_numpy() - rate],
                        marker="o", ms=3, lw=1, capsize=2, color=color)
        ax.axhline(delta, color="k", ls="--", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("calibration set size n")
        ax.set_ylabel("P(R(t̂) > α)")
        _title(ax, f"{scenario}, α = {alpha:g}")
    handles = [Line2D([], [], color=c, marker="o", ms=3) for c in colors] + [Line2D([], [], color="k", ls="--")]
    labels = [f"{search}/{bound}" for search, bound in series] + [f"δ = {delta:g}"]
    _shared_legend(fig, handles, labels, "Violation rate P(R(t̂) > α) with exact 95% intervals")
    return _save(fig, path)


def _palette(k: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if k <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(k)]
