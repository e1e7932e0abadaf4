"""Paper-style reports from a long (score, error) frame: tables, figures, baselines, written to a directory.

Input: a polars DataFrame with columns model, dataset, estimator, criterion, score, error (1 = wrong) and
optionally question_id — several (model, dataset, estimator, criterion) groups in one frame (see
`cic.store.score_files.check_long_frame`; files load with `cic.store.score_files.read_long_table`). Every
group runs the paper's protocol (`cic.evaluate_splits`), the split-ratio sensitivity study, the baselines on
the same splits (`cic.stats.baselines`) and the rejection statistics (`cic.stats.curves`);
`write_report` renders them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cic.errors import UserError
from cic.stats import baselines as _baselines
from cic.stats._validation import PARAMETERS, check_open_unit
from cic.stats.bounds import resolve_bound
from cic.stats.calibration import calibrate
from cic.stats.curves import confidence_of, expected_calibration_error, rejection_curve, risk_coverage_curve
from cic.stats.protocol import DEFAULT_ALPHAS, SPLIT_TABLE, evaluate_splits
from cic.stats.searches import DEFAULT_SEARCH, get_search
from cic.store.outputs import write_frame, write_text
from cic.store.score_files import GROUP_KEYS, check_long_frame

if TYPE_CHECKING:
    import polars as pl

SENSITIVITY_FRACTIONS: tuple[float, ...] = (0.5, 0.4, 0.3, 0.2, 0.1)


#: The label-budget curve's calibration sizes, as multiples of each group's table.
BUDGET_SIZES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class ReportConfig:
    """What a report computes. Defaults reproduce the paper: 100 splits 50/50, five alphas, HFD and CP.

    `searches` may hold any name of `cic.stats.searches.SEARCHES` ("holm" and "bonferroni" need `grid`,
    fixed in advance); the paper's tables use "paper". Empty `sensitivity_fractions`, `baselines` or
    `budget_sizes` skip those parts; `figures=False` skips the PNGs.
    Risk–coverage marks use `curve_bound` with the first search, calibrated on each group's full table
    (what `cic calibrate` would deploy). Baselines use `baseline_bound` for COIN and CIC's rows.
    """

    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    bounds: tuple[str, ...] = ("hoeffding", "cp")
    searches: tuple[str, ...] = (DEFAULT_SEARCH,)
    delta: float = 0.05
    n_splits: int = 100
    cal_fraction: float = 0.5
    seed: int = 0
    grid: tuple[float, ...] | None = None
    sensitivity_fractions: tuple[float, ...] = SENSITIVITY_FRACTIONS
    sensitivity_alphas: tuple[float, ...] = (0.1,)
    baselines: tuple[str, ...] = tuple(_baselines.METHODS)
    baseline_bound: str = "cp"
    curve_bound: str = "cp"
    figures: bool = True
    group_by: str | None = None  # "dataset": the per-dataset table (per-dataset gates at delta / G vs pooled)
    budget_sizes: tuple[float, ...] = BUDGET_SIZES  # the label-budget curve's sizes, as multiples of a group's
    budget_draws: int = 60                          # tables drawn per size (empty sizes: no curve)

    def __post_init__(self) -> None:
        for name in ("alphas", "bounds", "searches"):
            if not getattr(self, name):
                raise UserError(f"{name} is empty: give at least one")
        for name in ("alphas", "delta", "cal_fraction", "n_splits"):  # by their one declaration
            PARAMETERS[name].check(getattr(self, name), name)
        for i, a in enumerate(self.sensitivity_alphas):
            check_open_unit(a, f"sensitivity_alphas[{i}]")
        for i, f in enumerate(self.sensitivity_fractions):
            check_open_unit(f, f"sensitivity_fractions[{i}]")
        for i, m in enumerate(self.budget_sizes):
            if not (isinstance(m, int | float) and 0 < m <= 64):
                raise UserError(f"budget_sizes[{i}] = {m!r}: a multiple of the table's size in (0, 64]")
        if not (isinstance(self.budget_draws, int) and 1 <= self.budget_draws <= 10_000):
            raise UserError(f"budget_draws = {self.budget_draws!r}: an integer from 1 to 10,000")
        for b in (*self.bounds, self.baseline_bound, self.curve_bound):
            resolve_bound(b)
        for s in self.searches:
            if get_search(s).needs_grid and self.grid is None:
                raise UserError(f"search {s!r} needs grid: thresholds fixed before seeing the labels")
        for m in self.baselines:
            _baselines.METHODS.lookup(m, field="baseline")
        if self.group_by not in (None, "dataset"):
            raise UserError(f"group_by = {self.group_by!r}: the report groups by 'dataset' (or not at all)")

    def search_kwargs(self, search: str) -> dict[str, Any]:
        return {"grid": list(self.grid)} if get_search(search).takes_grid and self.grid is not None else {}


def iter_groups(frame: pl.DataFrame) -> Iterator[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """(group key, scores, errors) for each (model, dataset, estimator, criterion), in order of appearance."""
    for key, part in frame.group_by(list(GROUP_KEYS), maintain_order=True):
        yield (dict(zip(GROUP_KEYS, (str(k) for k in key), strict=True)), part.get_column("score").to_numpy(),
               part.get_column("error").to_numpy())


def _with_keys(key: dict[str, str], table: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    return table.select([pl.lit(v).alias(k) for k, v in key.items()] + [pl.all()])


def evaluate_groups(frame: pl.DataFrame, config: ReportConfig = ReportConfig()) -> pl.DataFrame:
    """The paper's protocol for every group: evaluate_splits rows with the group columns in front.

    The columns match the `evaluations` table of `cic.schema` (less ids and timestamps), so the rendered
    tables work on stored evaluations too.
    """
    import polars as pl

    frame = check_long_frame(frame)
    parts = []
    for key, scores, errors in iter_groups(frame):
        for search in config.searches:
            table = evaluate_splits(scores, errors, alphas=config.alphas, bounds=config.bounds, search=search,
                                    delta=config.delta, n_splits=config.n_splits, cal_fraction=config.cal_fraction,
                                    seed=config.seed, **config.search_kwargs(search))
            parts.append(_with_keys(key, table).with_columns(cal_fraction=pl.lit(config.cal_fraction),
                                                             seed=pl.lit(config.seed)))
    return pl.concat(parts)


def stored_results(frame: pl.DataFrame, config: ReportConfig, stored: pl.DataFrame) -> pl.DataFrame | None:
    """Stored evaluation rows (the `evaluations` table: the same protocol and seed) in `evaluate_groups`' columns
    and row order, or None when they do not cover every group × search × bound × α of `config` (then the report
    runs the protocol itself)."""
    import polars as pl

    axes = {"search": config.searches, "bound": config.bounds, "alpha": config.alphas}
    groups = frame.select(GROUP_KEYS).unique(maintain_order=True).with_row_index("_group")
    rows = stored.join(groups, on=list(GROUP_KEYS), how="inner").filter(
        *[pl.col(name).is_in(list(values)) for name, values in axes.items()],
        delta=config.delta, n_splits=config.n_splits, cal_fraction=config.cal_fraction, seed=config.seed)
    if rows.select("_group", *axes).n_unique() != groups.height * math.prod(len(v) for v in axes.values()) \
            or rows.height != groups.height * math.prod(len(v) for v in axes.values()):
        return None
    order = [pl.col(name).replace_strict({v: i for i, v in enumerate(values)}) for name, values in axes.items()]
    columns = [*GROUP_KEYS, *SPLIT_TABLE, "cal_fraction", "seed"]  # evaluate_groups' columns, in order
    return rows.sort([pl.col("_group"), *order]).select(columns)


def sensitivity_study(frame: pl.DataFrame, config: ReportConfig = ReportConfig(),
                      results: pl.DataFrame | None = None) -> pl.DataFrame:
    """The split-ratio study (paper Figure 2): the protocol at each calibration fraction, first search only.

    `results` (from `evaluate_groups` with the same config) supplies the fraction it already ran.
    """
    import polars as pl

    frame = check_long_frame(frame)
    parts = []
    search = config.searches[0]
    reusable = results is not None and set(config.sensitivity_alphas) <= set(config.alphas)
    for key, scores, errors in iter_groups(frame):
        for fraction in config.sensitivity_fractions:
            if reusable and fraction == config.cal_fraction:
                table = _rows_of(results, key).filter(pl.col("search") == search,
                                                      pl.col("alpha").is_in(list(config.sensitivity_alphas)))
                table = table.drop(*GROUP_KEYS, "cal_fraction", "seed")
            else:
                table = evaluate_splits(scores, errors, alphas=config.sensitivity_alphas, bounds=config.bounds,
                                        search=search, delta=config.delta, n_splits=config.n_splits,
                                        cal_fraction=fraction, seed=config.seed, **config.search_kwargs(search))
            parts.append(_with_keys(key, table).with_columns(cal_fraction=pl.lit(fraction)))
    return pl.concat(parts)


def _rows_of(results: pl.DataFrame, key: dict[str, str]) -> pl.DataFrame:
    """The rows of one group."""
    import polars as pl

    return results.filter(*(pl.col(k) == v for k, v in key.items()))


def baselines_study(frame: pl.DataFrame, config: ReportConfig = ReportConfig(),
                    results: pl.DataFrame | None = None) -> pl.DataFrame:
    """CIC and the baselines on the same splits, per group and alpha (`cic.stats.baselines.compare_methods`).

    `results` (from `evaluate_groups` with the same config) supplies the CIC rows it already holds.
    """
    import polars as pl

    frame = check_long_frame(frame)
    wanted = (*config.searches, DEFAULT_SEARCH, "fixed_sequence", "multistart")
    cic_searches = [s for s in dict.fromkeys(wanted) if config.grid is not None or not get_search(s).needs_grid]
    parts = []
    for key, scores, errors in iter_groups(frame):
        table = _baselines.compare_methods(scores, errors, alphas=config.alphas, methods=config.baselines,
                                           cic_searches=cic_searches, delta=config.delta,
                                           bound=config.baseline_bound, n_splits=config.n_splits,
                                           cal_fraction=config.cal_fraction, seed=config.seed,
                                           grid=None if config.grid is None else np.asarray(config.grid),
                                           known=None if results is None else _rows_of(results, key))
        parts.append(_with_keys(key, table))
    return pl.concat(parts)


def per_group_study(frame: pl.DataFrame, config: ReportConfig = ReportConfig()) -> pl.DataFrame | None:
    """Per (model, estimator, criterion) with two or more datasets: the split protocol per dataset with
    per-dataset gates certified at once (each at delta / G) beside the pooled gate (`evaluate_group_splits`),
    with the curve bound and the first search. None when no model has two datasets."""
    import polars as pl

    from cic.stats.groups import evaluate_group_splits

    search, rows = config.searches[0], []
    for (model, estimator, criterion), part in check_long_frame(frame).group_by(
            ["model", "estimator", "criterion"], maintain_order=True):
        if part.get_column("dataset").n_unique() < 2:
            continue
        for row in evaluate_group_splits(part.get_column("score").to_numpy(), part.get_column("error").to_numpy(),
                                         part.get_column("dataset").to_numpy(), alphas=config.alphas,
                                         delta=config.delta, bound=config.curve_bound, search=search,
                                         n_splits=config.n_splits, cal_fraction=config.cal_fraction, seed=config.seed,
                                         **config.search_kwargs(search)):
            rows.append({"model": model, "estimator": estimator, "criterion": criterion,
                         "bound": config.curve_bound, "search": search,
                         **{("dataset" if k == "group" else k): v for k, v in row.items()}})
    return pl.DataFrame(rows) if rows else None


def budget_study(frame: pl.DataFrame, config: ReportConfig) -> pl.DataFrame:
    """The label-budget curve per group and alpha (`cic.stats.limits.label_budget`): the group's table read as a
    law, `budget_draws` tables drawn at each size (multiples of its own), certified by the first search (the
    default where it needs a grid) with `curve_bound`: the share of draws certifying, the mean coverage, and the
    score's in-sample limit the curve climbs towards."""
    import polars as pl

    from cic.stats.limits import label_budget, score_limit

    search = config.searches[0] if not get_search(config.searches[0]).needs_grid else DEFAULT_SEARCH
    rows = []
    for key, scores, errors in iter_groups(check_long_frame(frame)):
        n = scores.shape[0]
        multiples = sorted(set(config.budget_sizes))
        sizes = [max(1, round(m * n)) for m in multiples]
        for alpha in config.alphas:
            limit = score_limit(scores, errors, alpha)
            points = label_budget(scores, errors, alpha=alpha, delta=config.delta, bound=config.curve_bound,
                                  search=search, sizes=sizes, draws=config.budget_draws, seed=config.seed)
            for multiple, point in zip(multiples, points, strict=True):
                rows.append({**key, "alpha": alpha, "search": search, "bound": config.curve_bound,
                             "multiple": float(multiple), "labels": point.size,
                             "certified_share": point.certified_share, "coverage": point.mean_coverage,
                             "score_limit": limit})
    return pl.DataFrame(rows, schema={**{k: pl.String for k in GROUP_KEYS}, "alpha": pl.Float64,
                                      "search": pl.String, "bound": pl.String, "multiple": pl.Float64,
                                      "labels": pl.Int64,
                                      "certified_share": pl.Float64, "coverage": pl.Float64,
                                      "score_limit": pl.Float64})


def prr_study(frame: pl.DataFrame) -> pl.DataFrame:
    """Prediction rejection ratio, the rejection-curve areas, AUARC and — for a score that is one minus a
    probability — ECE per group (`cic.stats.curves`; null ECE for other scores)."""
    import polars as pl

    frame = check_long_frame(frame)
    rows = []
    for key, scores, errors in iter_groups(frame):
        curve = rejection_curve(scores, errors)
        confidence = confidence_of(key["estimator"], scores)
        rows.append({**key, "prr": curve.prr, "auc_uncertainty": float(curve.uncertainty.mean()),
                     "auc_oracle": float(curve.oracle.mean()), "auc_random": curve.random,
                     "n_items": int(scores.shape[0]), "auarc": curve.auarc,
                     "ece": None if confidence is None else expected_calibration_error(confidence, 1 - errors)})
    return pl.DataFrame(rows, schema={**{k: pl.String for k in GROUP_KEYS}, "prr": pl.Float64,
                                      "auc_uncertainty": pl.Float64, "auc_oracle": pl.Float64,
                                      "auc_random": pl.Float64, "n_items": pl.Int64, "auarc": pl.Float64,
                                      "ece": pl.Float64})


# ----------------------------------------------------------------------------------------------------------
# Writing


@dataclass
class ReportFiles:
    """What `write_report` wrote, relative to `directory`, by kind."""

    directory: Path
    tables: list[Path] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    index: Path | None = None

    def all(self) -> list[Path]:
        return [*self.tables, *self.figures, *([self.index] if self.index else [])]


def file_slug(*parts: str) -> str:
    """A file-name-safe name from free text (model, dataset, estimator names): letters, digits, '-', '_' and
    single inner dots only, so no name can climb out of its directory ('..', '/', leading dots)."""
    text = "_".join(parts).lower()
    slug = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in text)
    while ".." in slug:
        slug = slug.replace("..", "_")
    return slug.strip("_.") or "group"


def _write(path: Path, text: str, files: list[Path], root: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text, "report file")
    files.append(path.relative_to(root))


def _risk_coverage_figures(frame: pl.DataFrame, config: ReportConfig, out: Path, files: ReportFiles) -> None:
    from cic.reports.figures import CurvePanel, risk_coverage_figure

    by_estimator: dict[tuple[str, str], list[CurvePanel]] = {}
    search = config.searches[0]
    for key, scores, errors in iter_groups(frame):
        curve = risk_coverage_curve(scores, errors)
        marks = []
        for alpha in config.alphas:
            res = calibrate(scores, errors, alpha=alpha, delta=config.delta, bound=config.curve_bound, search=search,
                            keep_table=False, **config.search_kwargs(search))
            marks.append((alpha, None if res.threshold is None else curve.at(res.threshold)))
        by_estimator.setdefault((key["estimator"], key["criterion"]), []).append(
            CurvePanel(f"{key['model']} / {key['dataset']}", curve.coverage, curve.risk, marks))
    for (estimator, criterion), panels in by_estimator.items():
        path = out / "figures" / f"risk_coverage_{file_slug(estimator, criterion)}.png"
        risk_coverage_figure(panels, path, f"Risk–coverage: {estimator} ({criterion}); certified thresholds "
                                           f"({config.curve_bound}, {search}, δ = {config.delta:g}, full table)")
        files.figures.append(path.relative_to(out))


def write_report(frame: pl.DataFrame, out_dir: str | Path, config: ReportConfig | None = None, *,
                 stored: pl.DataFrame | None = None, **overrides: Any) -> ReportFiles:
    """Compute everything for `frame` and write tables (.md/.tex/.csv), figures (.png) and README.md to out_dir.

    `overrides` replace fields of `config` (e.g. n_splits=20). `stored`: evaluation rows already computed with
    this config (the store's), used instead of running the protocol again. Returns the written paths (relative).
    """
    from cic.reports import tables as rt

    unknown = sorted(set(overrides) - {f.name for f in fields(ReportConfig)})
    if unknown:
        raise UserError(f"unknown report setting(s) {', '.join(unknown)}; settings are: "
                         f"{', '.join(f.name for f in fields(ReportConfig))}")
    config = replace(config or ReportConfig(), **overrides)
    import polars as pl

    frame = check_long_frame(frame)
    if config.group_by and frame.group_by("model", "estimator", "criterion").agg(
            pl.col("dataset").n_unique()).get_column("dataset").max() < 2:
        raise UserError("group_by = 'dataset': no model has two or more datasets in this table; give the tables "
                         "of each dataset (the per-dataset table compares them)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"out_dir = {str(out)!r}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out)
    tables = out / "tables"

    tables.mkdir(exist_ok=True)
    results = stored_results(frame, config, stored) if stored is not None else None
    results = evaluate_groups(frame, config) if results is None else results
    write_frame(results, tables / "results.csv", "report file")
    files.tables.append(Path("tables/results.csv"))
    for metric in rt.METRICS:
        _write(tables / f"{metric}.md", rt.paper_table_markdown(results, metric), files.tables, out)
        _write(tables / f"{metric}.tex", rt.paper_table_latex(results, metric), files.tables, out)

    sensitivity = sensitivity_study(frame, config, results) if config.sensitivity_fractions else None
    if sensitivity is not None:
        write_frame(sensitivity, tables / "sensitivity.csv", "report file")
        files.tables.append(Path("tables/sensitivity.csv"))
        _write(tables / "sensitivity.md", rt.sensitivity_markdown(sensitivity), files.tables, out)
    comparison = baselines_study(frame, config, results) if config.baselines else None
    if comparison is not None:
        write_frame(comparison, tables / "baselines.csv", "report file")
        files.tables.append(Path("tables/baselines.csv"))
        _write(tables / "baselines.md", rt.baselines_markdown(comparison), files.tables, out)
    per_group = per_group_study(frame, config) if config.group_by else None
    if per_group is not None:
        write_frame(per_group, tables / "per_group.csv", "report file")
        files.tables.append(Path("tables/per_group.csv"))
        _write(tables / "per_group.md", rt.per_group_markdown(per_group), files.tables, out)
    budget = budget_study(frame, config) if config.budget_sizes else None
    if budget is not None:
        write_frame(budget, tables / "budget.csv", "report file")
        files.tables.append(Path("tables/budget.csv"))
        _write(tables / "budget.md", rt.budget_markdown(budget), files.tables, out)
    prr = prr_study(frame)
    write_frame(prr, tables / "prr.csv", "report file")
    files.tables.append(Path("tables/prr.csv"))
    _write(tables / "prr.md", rt.prr_markdown(prr), files.tables, out)

    if config.figures:
        from cic.reports import figures as rf

        figures = out / "figures"
        _risk_coverage_figures(frame, config, out, files)
        files.figures.append(rf.fdr_vs_alpha_figure(results, figures / "fdr_vs_alpha.png").relative_to(out))
        files.figures.append(rf.coverage_vs_alpha_figure(results, figures / "coverage_vs_alpha.png").relative_to(out))
        if sensitivity is not None:
            files.figures.append(rf.sensitivity_figure(sensitivity, figures / "sensitivity.png").relative_to(out))
        files.figures.append(rf.prr_figure(prr, figures / "prr.png").relative_to(out))
        if budget is not None:
            files.figures.append(rf.budget_figure(budget, figures / "budget.png").relative_to(out))

    index = out / "README.md"
    write_text(index, _index(frame, config, results, files), "report file")
    files.index = index.relative_to(out)
    return files


def _evaluated_by(frame: pl.DataFrame) -> list[str]:
    """One line naming who evaluated the answers (a converted harness output's `source` column), or none."""
    if "source" not in frame.columns:
        return []
    sources = sorted(set(frame.get_column("source").drop_nulls().to_list()))
    return [f"Answers evaluated by {', '.join(sources)} (read by `cic.store.harness`).", ""] if sources else []


def _index(frame: pl.DataFrame, config: ReportConfig, results: pl.DataFrame, files: ReportFiles) -> str:
    """The report's README.md: what was run, the FDR table inline, links to every table and figure."""
    from cic.reports import tables as rt

    n_groups = frame.select(GROUP_KEYS).unique().height
    searches_described = ", ".join(f"{s} ({get_search(s).short_guarantee})" for s in config.searches)
    lines = [
        "# CIC report", "",
        f"{n_groups} (model, dataset, estimator, criterion) group(s), {frame.height:,} items. Protocol: "
        f"{config.n_splits} random calibration/test splits (calibration fraction {config.cal_fraction:g}, seed "
        f"{config.seed}), α ∈ {{{', '.join(f'{a:g}' for a in config.alphas)}}}, δ = {config.delta:g}, bounds "
        f"{', '.join(rt.bound_label(b) for b in config.bounds)}, search "
        f"{searches_described}.", "", *_evaluated_by(frame),
        "FDR = errors among accepted test answers (mean ± std over the splits that found a threshold); power = "
        "coverage = accepted / test size; correct coverage = accepted-and-correct / correct; Fail = splits where "
        "α was unattainable (never dropped); — = every split failed.", "",
        "## Test FDR", "", rt.paper_table_markdown(results, "fdr"),
        "## Tables", "",
    ]
    described = {"fdr": "test FDR with Fail and base error rate (paper Tables 1–2)",
                 "coverage": "power = coverage (paper Tables 3–4)",
                 "correct_coverage": "correct coverage (COIN's power)",
                 "sensitivity": "split-ratio sensitivity (paper Figure 2)",
                 "baselines": "CIC against naive, COIN-style, Conformal Alignment and LEC-style rules, same splits",
                 "per_group": "per dataset: per-dataset gates certified at once (δ / G each) beside the pooled gate",
                 "budget": "label budget: certified coverage against labelled answers, and where more stop paying",
                 "prr": "prediction rejection ratio, AUARC and ECE per estimator",
                 "results": "every protocol row (CSV)"}
    stems = list(dict.fromkeys(p.stem for p in files.tables))
    for stem in stems:
        links = ", ".join(f"[{p.suffix[1:]}]({p.as_posix()})" for p in files.tables if p.stem == stem)
        lines.append(f"- {described.get(stem, stem)}: {links}")
    if files.figures:
        lines += ["", "## Figures", ""]
        captions = {"fdr_vs_alpha": "Empirical test FDR against α (dashed: y = α)",
                    "sensitivity": "Split-ratio sensitivity: alignment 1 − FDR against calibration:test (paper "
                                   "Figure 2)",
                    "prr": "Prediction rejection ratio per estimator",
                    "budget": "Label budget: certified coverage against labelled answers (dashed: the score's limit)"}
        for p in files.figures:
            caption = captions.get(p.stem, f"Risk–coverage with certified thresholds: "
                                           f"{p.stem.removeprefix('risk_coverage_')}")
            lines += [f"### {caption}", "", f"![{p.stem}]({p.as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"
