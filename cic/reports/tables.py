"""Render result frames as Markdown and LaTeX tables laid out like the paper's Tables 1–4.

The paper tables take evaluation rows shaped like `cic.evaluate_splits` output plus the group columns
(model, dataset, estimator, criterion) — the `evaluations` layout of `cic.schema` — so stored results render
the same way as fresh ones. One table block per (dataset, estimator, criterion, search); rows are model × bound,
columns the risk levels. "—" marks an entry where every split failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.registry import Registry

if TYPE_CHECKING:
    import polars as pl

DASH = "—"


def mean_std(mean: float | None, std: float | None) -> str:
    """A 'mean ± std' cell (FDR over the splits that found a threshold): — when no split found one."""
    return DASH if mean is None else f"{mean:.3f} ± {std:.3f}"
GROUP_KEYS = ("model", "dataset", "estimator", "criterion")


@dataclass(frozen=True)
class Metric:
    """One paper-table metric: the column it reads, its short header and the caption wording."""

    name: str
    header: str
    caption: str
    with_base_error: bool


METRICS: Registry[Metric] = Registry("metric", (
    Metric("fdr", "FDR", "Test-time FDR (mean ± std across {n} splits)", True),
    Metric("coverage", "Power", "Test-time power: coverage = accepted / test size (mean across {n} splits)", False),
    Metric("correct_coverage", "Corr. cov.",
           "Test-time correct coverage: accepted-and-correct / correct (mean across {n} splits)", False),
))


def bound_label(bound: str) -> str:
    """The paper's name for a bound (UCB-HFD, UCB-CP), UCB-<name> for the others (from the bound registry)."""
    from cic.stats.bounds import BOUNDS

    record = BOUNDS.get(bound)
    return record.table_label if record is not None and record.table_label else f"UCB-{bound}"


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number, or "—" when missing."""
    return DASH if value is None else format(value, spec)


def ratio_label(cal_fraction: float) -> str:
    """The calibration:test ratio of a fraction, e.g. 0.4 -> "2:3", 0.1 -> "1:9" (as in the paper's Figure 2)."""
    from fractions import Fraction

    f = Fraction(cal_fraction).limit_denominator(100)
    return f"{f.numerator}:{f.denominator - f.numerator}"


_LATEX = {**{ch: "\\" + ch for ch in "&%$#_{}"}, "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
          "\\": r"\textbackslash{}", "α": r"$\alpha$", "δ": r"$\delta$", "±": r"$\pm$"}


def latex_escape(text: str) -> str:
    """Escape LaTeX special characters in a label (and write α, δ, ± in math mode)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table ("|" in cells escaped)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def varying_keys(frame: pl.DataFrame, keys: Sequence[str] = GROUP_KEYS) -> list[str]:
    """The group columns that take more than one value (all of `keys[:1]` when none does)."""
    varying = [k for k in keys if frame.get_column(k).n_unique() > 1]
    return varying or list(keys[:1])


# ----------------------------------------------------------------------------------------------------------
# The paper tables


@dataclass(frozen=True)
class _Block:
    dataset: str
    estimator: str
    criterion: str
    search: str
    n_splits: int
    delta: float
    alphas: list[float]
    models: list[tuple[str, list[tuple[str, list[tuple[str, str]]]], str]]  # model, [(bound, cells)], base ER


def _cell(row: dict[str, Any] | None, metric: Metric) -> tuple[str, str, bool]:
    """(value, fails, every split failed) for one (model, bound, alpha) entry; "n/a" when the row is missing."""
    if row is None:
        return "n/a", "n/a", False
    all_failed = row["fails"] >= row["n_splits"]
    if metric.name == "fdr":
        value = mean_std(row["fdr_mean"], row["fdr_std"])
    else:
        value = DASH if all_failed or row[f"{metric.name}_mean"] is None else f"{row[f'{metric.name}_mean']:.3f}"
    return value, str(row["fails"]), all_failed


def _blocks(results: pl.DataFrame, metric: Metric) -> list[_Block]:
    needed = (*GROUP_KEYS, "alpha", "bound", "search", "fails", "n_splits", "base_error_rate", "delta",
              f"{metric.name}_mean", *(("fdr_std",) if metric.name == "fdr" else ()))
    missing = [c for c in needed if c not in results.columns]
    if missing:
        raise UserError(f"results lack column(s) {', '.join(missing)} needed for the {metric.name} table")
    if results.height == 0:
        raise UserError("results are empty: nothing to tabulate")
    rows = list(results.iter_rows(named=True))
    index = {(r["model"], r["dataset"], r["estimator"], r["criterion"], r["search"], r["bound"], r["alpha"]): r
             for r in rows}
    blocks: list[_Block] = []
    for key in dict.fromkeys((r["dataset"], r["estimator"], r["criterion"], r["search"]) for r in rows):
        mine = [r for r in rows if (r["dataset"], r["estimator"], r["criterion"], r["search"]) == key]
        alphas = sorted({r["alpha"] for r in mine})
        models = []
        for model in dict.fromkeys(r["model"] for r in mine):
            of_model = [r for r in mine if r["model"] == model]
            per_bound = []
            for bound in dict.fromkeys(r["bound"] for r in of_model):
                cells = []
                for alpha in alphas:
                    value, fails, _ = _cell(index.get((model, key[0], key[1], key[2], key[3], bound, alpha)), metric)
                    cells.append((value, fails))
                per_bound.append((bound, cells))
            models.append((model, per_bound, f"{of_model[0]['base_error_rate']:.3f}"))
        blocks.append(_Block(*key, n_splits=int(mine[0]["n_splits"]), delta=float(mine[0]["delta"]),
                             alphas=alphas, models=models))
    return blocks


def _block_title(block: _Block, metric: Metric) -> str:
    return (f"{metric.caption.format(n=block.n_splits)} on {block.dataset} ({block.estimator}, "
            f"{block.criterion}; search {block.search}, δ = {block.delta:g})")


def paper_table_markdown(results: pl.DataFrame, metric: str = "fdr") -> str:
    """The paper's table for `metric` ("fdr", "coverage", "correct_coverage") in Markdown, one block per dataset."""
    m = METRICS.lookup(metric)
    parts = []
    for block in _blocks(results, m):
        headers = ["LLM", "UCB / α"]
        for alpha in block.alphas:
            headers += [f"{alpha:g} {m.header}", "Fail"]
        if m.with_base_error:
            headers.append("Base ER")
        rows = []
        for model, per_bound, base in block.models:
            for i, (bound, cells) in enumerate(per_bound):
                row = [model if i == 0 else "", bound_label(bound)]
                for value, fails in cells:
                    row += [value, fails]
                if m.with_base_error:
                    row.append(base if i == 0 else "")
                rows.append(row)
        parts.append(f"**{_block_title(block, m)}**\n\n{markdown_table(headers, rows)}")
    return "\n\n".join(parts) + "\n"


def paper_table_latex(results: pl.DataFrame, metric: str = "fdr", label_prefix: str = "tab") -> str:
    """The paper's table for `metric` in LaTeX (booktabs, multirow, graphicx), one table* per block."""
    m = METRICS.lookup(metric)
    out = [f"% Generated by cic report. Needs \\usepackage{{booktabs,multirow,graphicx}}. Metric: {m.name}."]
    for number, block in enumerate(_blocks(results, m), start=1):
        k = len(block.alphas)
        spec = "ll" + " cc" * k + (" c" if m.with_base_error else "")
        head = [r"\multirow{2}{*}{LLMs}", r"\multirow{2}{*}{UCBs/$\alpha$}"]
        head += [f"\\multicolumn{{2}}{{c}}{{{alpha:g}}}" for alpha in block.alphas]
        sub = ["", ""] + [f"{latex_escape(m.header)} & Fail" for _ in block.alphas]
        if m.with_base_error:
            head.append(r"\multirow{2}{*}{Base ER}")
            sub.append("")
        rules = "".join(f"\\cmidrule(lr){{{3 + 2 * i}-{4 + 2 * i}}}" for i in range(k))
        lines = [r"\begin{table*}[!t]", r"\centering",
                 f"\\caption{{{latex_escape(_block_title(block, m))}.}}",
                 f"\\label{{{label_prefix}:{m.name}-{number}}}",
                 r"\resizebox{\textwidth}{!}{%", f"\\begin{{tabular}}{{{spec}}}", r"\toprule",
                 " & ".join(head) + r" \\", rules, " & ".join(sub) + r" \\", r"\midrule"]
        for j, (model, per_bound, base) in enumerate(block.models):
            span = len(per_bound)
            for i, (bound, cells) in enumerate(per_bound):
                first = f"\\multirow{{{span}}}{{*}}{{{latex_escape(model)}}}" if i == 0 and span > 1 else (
                    latex_escape(model) if i == 0 else "")
                row = [first, latex_escape(bound_label(bound))]
                for value, fails in cells:
                    row += [_latex_value(value), fails]
                if m.with_base_error:
                    row.append((f"\\multirow{{{span}}}{{*}}{{{base}}}" if span > 1 else base) if i == 0 else "")
                lines.append(" & ".join(row) + r" \\")
            lines.append(r"\midrule" if j < len(block.models) - 1 else r"\bottomrule")
        lines += [r"\end{tabular}%", "}", r"\end{table*}"]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _latex_value(value: str) -> str:
    if value == DASH:
        return "---"
    if "±" in value:
        mean, std = (v.strip() for v in value.split("±"))
        return f"${mean} \\pm {std}$"
    return latex_escape(value)


# ----------------------------------------------------------------------------------------------------------
# The other report tables


def sensitivity_markdown(frame: pl.DataFrame) -> str:
    """Split-ratio sensitivity: one row per group × bound × alpha, one column per calibration:test ratio."""
    keys = varying_keys(frame)
    fractions = sorted(set(frame.get_column("cal_fraction").to_list()), reverse=True)
    headers = ["group", "UCB", "α"] + [f"{ratio_label(f)} (cal {f:g})" for f in fractions]
    rows = []
    lookup = {(r["_g"], r["bound"], r["alpha"], r["cal_fraction"]): r
              for r in frame.with_columns(_g=_group_expr(keys)).iter_rows(named=True)}
    for g, bound, alpha in dict.fromkeys((k[0], k[1], k[2]) for k in lookup):
        row: list[str] = [g, bound_label(bound), f"{alpha:g}"]
        for f in fractions:
            r = lookup.get((g, bound, alpha, f))
            if r is None:
                row.append("n/a")
            elif r["fdr_mean"] is None:
                row.append(f"{DASH} (fails {r['fails']})")
            else:
                row.append(f"{1 - r['fdr_mean']:.3f} ± {r['fdr_std']:.3f}, cov {r['coverage_mean']:.3f}, "
                           f"fails {r['fails']}")
        rows.append(row)
    note = ("Cells: alignment proportion 1 − test FDR (mean ± std over the splits that found a threshold), "
            "coverage (accepted / test size, mean over all splits) and fails. Target: alignment ≥ 1 − α.")
    return f"{note}\n\n{markdown_table(headers, rows)}\n"


def baselines_markdown(frame: pl.DataFrame) -> str:
    """The baselines table: per group, alpha and method, what each method delivers and what it claims."""
    keys = varying_keys(frame)
    headers = ["group", "α", "method", "guarantee", "FDR (mean ± std)", "E[FDP]", "splits with test FDR > α",
               "coverage", "correct cov.", "fails"]
    rows = []
    for r in frame.with_columns(_g=_group_expr(keys)).iter_rows(named=True):
        fdr = mean_std(r["fdr_mean"], r["fdr_std"])
        rows.append([r["_g"], f"{r['alpha']:g}", r["label"], r["guarantee"], fdr, f"{r['fdp_mean']:.3f}",
                     fmt(r["fdr_above_alpha"], ".2f"),
                     f"{r['coverage_mean']:.3f}", fmt(r["correct_coverage_mean"]), f"{r['fails']}/{r['n_splits']}"])
    claims = frame.unique("label", maintain_order=True)
    notes = "\n".join(f"- **{r['label']}** ({r['guarantee']}): {r['claim']}" for r in claims.iter_rows(named=True))
    return (f"{markdown_table(headers, rows)}\n\nWhat each method claims:\n\n{notes}\n\n"
            "FDR (mean ± std) and \"splits with test FDR > α\" are over the splits that selected something (a "
            "finite test set scatters around the true risk, so even a valid method shows some); E[FDP] averages "
            "over all splits with 0 where nothing was accepted — the quantity the expectation guarantees bound.\n")


def per_group_markdown(frame: pl.DataFrame) -> str:
    """Per dataset (group): the per-group gates (each at delta / G, certified at once) beside the pooled gate,
    each judged on that dataset's test part."""
    headers = ["model", "estimator", "criterion", "bound", "α", "dataset", "size", "gate", "test FDR",
               "splits FDR > α", "coverage", "fails"]
    rows = [[r["model"], r["estimator"], r["criterion"], bound_label(r["bound"]), f"{r['alpha']:g}", r["dataset"],
             r["size"], "per dataset (δ/G)" if r["gate"] == "per_group" else "pooled (δ)", fmt(r["fdr_mean"]),
             fmt(r["fdr_above_alpha"], ".2f"), fmt(r["coverage_mean"]), f"{r['fails']}/{r['n_splits']}"]
            for r in frame.sort("model", "estimator", "criterion", "bound", "alpha", "dataset", "gate")
            .iter_rows(named=True)]
    return (f"{markdown_table(headers, rows)}\n\nPer-dataset gates: each dataset of a model calibrated on its "
            "own data at δ / G for its G datasets, so with probability ≥ 1 − δ every dataset's error rate among "
            "its accepted answers is ≤ α at once. The pooled gate is one threshold for the mix: its guarantee holds "
            "on average over the datasets, and a dataset worse than the mix can sit above α under it. Test FDR is "
            "over the splits where the dataset was served a threshold that accepted something; fails = splits "
            "where it was served none (α unattainable for it).\n")


def budget_markdown(frame: pl.DataFrame) -> str:
    """The label-budget curve: one row per group and alpha, a column per calibration size as a multiple of the
    group's table (mean certified coverage, the share of draws certifying), the score's limit, and where more
    labels stop paying."""
    from cic.stats.limits import BUDGET_FLAT, stops_paying

    keys = varying_keys(frame)
    marked = frame.with_columns(_g=_group_expr(keys))
    multiples = sorted(set(frame.get_column("multiple").to_list()))
    headers = ["group", "labels", "α", *[f"{m:g}×" for m in multiples], "score's limit", "more labels stop paying"]
    rows = []
    for (group, alpha), part in marked.group_by("_g", "alpha", maintain_order=True):
        part = part.sort("labels")
        cells = {r["multiple"]: f"{r['coverage']:.3f} ({r['certified_share']:.0%})" for r in part.iter_rows(named=True)}
        stop = stops_paying(part.get_column("labels").to_list(), part.get_column("coverage").to_list())
        limit = part["score_limit"][0]
        own = part.filter(part["multiple"] == 1.0)["labels"]
        said = "never: no threshold reaches α in-sample" if limit == 0 else DASH if stop is None else f"~{stop:,}"
        rows.append([group, f"{own[0]:,}" if own.len() else DASH, f"{alpha:g}",
                     *[cells.get(m, "n/a") for m in multiples], f"{limit:.3f}", said])
    first = frame.row(0, named=True) if frame.height else {"search": "", "bound": ""}
    note = (f"Cells: mean certified coverage over the tables drawn at that multiple of the group's labels from its "
            f"own table (read as a law), and the share of them certifying anything ({first['search']} search, "
            f"{first['bound']} bound). More labels stop paying at the first size whose doubling adds less than "
            f"{BUDGET_FLAT:g} coverage (— : every doubling shown still pays, or nothing certifies); the curve climbs "
            "towards the score's limit. Where that limit is 0 no size helps: what a small draw certifies there is "
            "the δ it is allowed to be wrong. An estimate from the labels at hand (`cic.stats.limits`).")
    return markdown_table(headers, rows) + "\n\n" + note + "\n"


def prr_markdown(frame: pl.DataFrame) -> str:
    """Prediction rejection ratio per group (1 = ranks every error last, 0 = random), AUARC (accuracy of the kept
    answers over rejection rates) and ECE ("—" where the score is not one minus a probability)."""
    keys = varying_keys(frame)
    headers = ["group", "PRR", "AUARC", "ECE", "AUC (uncertainty)", "AUC (oracle)", "AUC (random)", "items"]
    rows = [[r["_g"], fmt(r["prr"]), f"{r['auarc']:.4f}", fmt(r["ece"]), f"{r['auc_uncertainty']:.4f}",
             f"{r['auc_oracle']:.4f}", f"{r['auc_random']:.4f}", r["n_items"]]
            for r in frame.with_columns(_g=_group_expr(keys)).iter_rows(named=True)]
    return markdown_table(headers, rows) + "\n"


def validity_markdown(frame: pl.DataFrame) -> str:
    """Monte-Carlo violation rates with exact binomial confidence intervals against delta."""
    headers = ["scenario", "n", "α", "search", "bound", "violations / trials", "violation rate [95% CI]", "vs δ",
               "fails", "mean coverage (oracle)"]
    rows = []
    for r in frame.iter_rows(named=True):
        verdict = f"**{r['verdict']}**" if r["verdict"] == "exceeds delta" else r["verdict"]
        rows.append([r["scenario"], r["n"], f"{r['alpha']:g}", r["search"], r["bound"],
                     f"{r['n_violations']}/{r['n_trials']}",
                     f"{r['violation_rate']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]",
                     verdict.replace("delta", "δ"), r["fails"],
                     f"{r['mean_coverage']:.3f} ({r['oracle_coverage']:.3f})"])
    return markdown_table(headers, rows) + "\n"


def _group_expr(keys: Sequence[str]) -> Any:
    import polars as pl

    return pl.concat_str([pl.col(k) for k in keys], separator=" / ")
