"""The front page of a report folder (`cic-reports/README.md`): every group at a glance, and per model × dataset one
figure comparing every estimator's PRR and one of every estimator's coverage against α — the comparisons the
per-group folders (one estimator each, hash-named) cannot show."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from cic.stats.searches import DEFAULT_SEARCH

INDEX = "README.md"
OVERVIEW = "overview"  # the cross-estimator figures, beside the group folders
GLANCE_BOUND = "cp"


def _read_all(root: Path, name: str) -> pl.DataFrame:
    """Every group folder's `tables/<name>` stacked, each row with its folder."""
    parts = [pl.read_csv(path, infer_schema_length=None).with_columns(folder=pl.lit(path.parent.parent.name))
             for path in sorted(root.glob(f"*/tables/{name}"))]
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def _cell(value: object, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def write_report_index(root: Path) -> Path | None:
    """Write `root/README.md` and `root/overview/*.png` from the group folders' tables; None when there is none."""
    from cic.reports.figures import coverage_vs_alpha_figure, prr_figure

    evaluations, prr = _read_all(root, "evaluations.csv"), _read_all(root, "prr.csv")
    if evaluations.is_empty():
        return None
    search = DEFAULT_SEARCH if DEFAULT_SEARCH in set(evaluations.get_column("search")) else \
        evaluations.get_column("search")[0]
    bound = GLANCE_BOUND if GLANCE_BOUND in set(evaluations.get_column("bound")) else evaluations.get_column("bound")[0]
    glance = evaluations.filter(search=search, bound=bound)
    alphas = sorted(set(glance.get_column("alpha").to_list()))
    lines = [f"# CIC reports: {glance.select('folder').n_unique()} group(s)", "",
             f"Coverage (share of test questions answered, mean over splits) at each α with the {bound} bound and "
             f"the {search} search; `fails`: splits where α was unattainable. Each group's folder holds its "
             "tables and figures; `overview/` compares every estimator of a model on a dataset.", "",
             "| model | dataset | estimator | criterion | PRR | base error | "
             + " | ".join(f"α = {a:g}" for a in alphas) + " | report |",
             "|" + "---|" * (7 + len(alphas))]
    prr_of = {r["folder"]: r["prr"] for r in prr.iter_rows(named=True)} if not prr.is_empty() else {}
    for (folder,), rows in glance.sort("model", "dataset", "estimator", "criterion").group_by("folder",
                                                                                              maintain_order=True):
        first = rows.row(0, named=True)
        by_alpha = {r["alpha"]: r for r in rows.iter_rows(named=True)}
        cells = [f"{_cell(by_alpha[a]['coverage_mean'], '.2f')} · fails {by_alpha[a]['fails']}" if a in by_alpha
                 else "—" for a in alphas]
        lines.append(f"| {first['model']} | {first['dataset']} | {first['estimator']} | {first['criterion']} | "
                     f"{_cell(prr_of.get(folder), '.2f')} | {_cell(first['base_error_rate'], '.3f')} | "
                     + " | ".join(cells) + f" | [{folder}]({folder}/README.md) |")
    (root / OVERVIEW).mkdir(exist_ok=True)
    for (model, dataset), rows in evaluations.group_by("model", "dataset", maintain_order=True):
        stem = _safe(f"{model}_{dataset}")
        lines += ["", f"## {model} on {dataset}", ""]
        both = rows.filter(search=search).drop("folder")
        coverage_vs_alpha_figure(both, root / OVERVIEW / f"{stem}_coverage_vs_alpha.png")
        lines.append(f"![every estimator's coverage against α]({OVERVIEW}/{stem}_coverage_vs_alpha.png)")
        scored = prr.filter(model=model, dataset=dataset).drop("folder") if not prr.is_empty() else prr
        if not scored.is_empty():
            prr_figure(scored, root / OVERVIEW / f"{stem}_prr.png")
            lines.append(f"![every estimator's PRR]({OVERVIEW}/{stem}_prr.png)")
    path = root / INDEX
    path.write_text("\n".join(lines) + "\n")
    return path
