"""`cic-reports/README.md`: every group of a report folder at a glance, linked, and per model × dataset one figure
of every estimator's coverage against α and one of every estimator's PRR."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from cic.reports.report_index import OVERVIEW, write_report_index

ALPHAS = (0.1, 0.2)


def _group(root: Path, model: str, estimator: str, prr: float, coverage: float) -> str:
    folder = f"{model}_d_{estimator}_0123456789"
    tables = root / folder / "tables"
    tables.mkdir(parents=True)
    rows = [{"model": model, "dataset": "d", "estimator": estimator, "criterion": "em", "alpha": a, "bound": b,
             "search": s, "coverage_mean": coverage * a, "coverage_std": 0.01, "fdr_mean": a / 2, "fdr_std": 0.01,
             "fails": 0 if a > 0.1 else 3, "n_splits": 10, "base_error_rate": 0.3}
            for a in ALPHAS for b in ("cp", "hoeffding") for s in ("fallback", "paper")]
    pl.DataFrame(rows).write_csv(tables / "evaluations.csv")
    pl.DataFrame([{"model": model, "dataset": "d", "estimator": estimator, "criterion": "em", "prr": prr}]) \
        .write_csv(tables / "prr.csv")
    return folder


def test_the_index_lists_every_group_and_compares_every_estimator_of_a_model_on_a_dataset(tmp_path: Path) -> None:
    folders = [_group(tmp_path, m, e, prr, cov) for m, e, prr, cov in
               (("a", "se", 0.5, 2.0), ("a", "pe", 0.4, 1.0), ("b", "se", 0.3, 0.5))]
    index = write_report_index(tmp_path)
    text = index.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    assert len(rows) == 3 and all(f"[{f}]({f}/README.md)" in text for f in folders)
    se = next(r for r in rows if r.startswith("| a | d | se |"))
    assert "| 0.50 | 0.300 | 0.20 · fails 3 | 0.40 · fails 0 |" in se  # cp, fallback: PRR, base error, per α
    for model in ("a", "b"):
        for figure in ("coverage_vs_alpha", "prr"):
            assert (tmp_path / OVERVIEW / f"{model}_d_{figure}.png").stat().st_size > 5_000
            assert f"]({OVERVIEW}/{model}_d_{figure}.png)" in text
    assert text.count("## ") == 2  # a section per model × dataset


def test_a_folder_without_group_reports_gets_no_index(tmp_path: Path) -> None:
    assert write_report_index(tmp_path) is None and not (tmp_path / "README.md").exists()
