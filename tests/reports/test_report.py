"""Reports: input checks, hand-computed table entries, LaTeX shape, and the written directory."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import cic
from cic.errors import UserError
from cic.reports.report import (
    ReportConfig,
    baselines_study,
    budget_study,
    evaluate_groups,
    prr_study,
    sensitivity_study,
    stored_results,
    write_report,
)
from cic.reports.tables import paper_table_latex, paper_table_markdown, ratio_label
from cic.stats import bounds
from cic.store.score_files import check_long_frame

N_SPLITS = 10
FAST = dict(n_splits=N_SPLITS, sensitivity_fractions=(), baselines=(), figures=False, searches=("paper",),
            budget_sizes=())


def _group(model: str, dataset: str, scores: np.ndarray, errors: np.ndarray, estimator: str = "se") -> pl.DataFrame:
    return pl.DataFrame({"model": model, "dataset": dataset, "estimator": estimator, "criterion": "match",
                         "question_id": [f"q{i}" for i in range(scores.shape[0])], "score": scores,
                         "error": errors})


def _hand_frame() -> pl.DataFrame:
    """Two groups of 200 tied scores (one candidate threshold: accept all or nothing), 100 calibration items.

    "perfect": no errors. "tenth": the first 20 items wrong (base error rate 0.1).
    """
    tied = np.full(200, 0.5)
    tenth = np.r_[np.ones(20, dtype=int), np.zeros(180, dtype=int)]
    return pl.concat([_group("perfect", "demo", tied, np.zeros(200, dtype=int)), _group("tenth", "demo", tied, tenth)])


def _expected_tenth(alpha: float, bound: str) -> tuple[str, int]:
    """The 'tenth' entry computed from the splits and the bound directly: accept all iff UCB(FD_cal, 100) <= alpha."""
    errors = np.r_[np.ones(20, dtype=int), np.zeros(180, dtype=int)]
    fdrs = []
    for cal in cic.split_masks(200, N_SPLITS, 0.5, seed=0):
        fd = int(errors[cal].sum())
        if bounds.feasible(bound, fd, 100, alpha, 0.05):
            fdrs.append((20 - fd) / 100)
    if not fdrs:
        return "—", N_SPLITS
    return f"{np.mean(fdrs):.3f} ± {np.std(fdrs):.3f}", N_SPLITS - len(fdrs)


def _markdown_rows(md: str) -> dict[tuple[str, str], list[str]]:
    rows, model = {}, ""
    for line in md.splitlines():
        if not line.startswith("| ") or line.startswith("| LLM"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        model = cells[0] or model
        rows[(model, cells[1])] = cells[2:]
    return rows


def test_fdr_table_reproduces_hand_computed_entries() -> None:
    results = evaluate_groups(_hand_frame(), ReportConfig(**FAST))
    rows = _markdown_rows(paper_table_markdown(results, "fdr"))
    # no errors, n_cal = 100: Hoeffding's UCB sqrt(log 20 / 200) = 0.122 fails alpha 0.05 and 0.10 everywhere
    assert rows[("perfect", "UCB-HFD")] == ["—", "10", "—", "10", "0.000 ± 0.000", "0", "0.000 ± 0.000", "0",
                                            "0.000 ± 0.000", "0", "0.000"]
    # Clopper–Pearson at FD = 0: 1 - 0.05^(1/100) = 0.0295 <= 0.05
    assert rows[("perfect", "UCB-CP")] == ["0.000 ± 0.000", "0"] * 5 + [""]
    for bound, label in (("hoeffding", "UCB-HFD"), ("cp", "UCB-CP")):
        got = rows[("tenth", label)]
        for i, alpha in enumerate(cic.stats.protocol.DEFAULT_ALPHAS):
            assert got[2 * i:2 * i + 2] == [_expected_tenth(alpha, bound)[0], str(_expected_tenth(alpha, bound)[1])]
    assert rows[("tenth", "UCB-HFD")][-1] == "0.100"


def test_power_tables_show_dash_where_every_split_failed() -> None:
    results = evaluate_groups(_hand_frame(), ReportConfig(**FAST))
    power = _markdown_rows(paper_table_markdown(results, "coverage"))
    assert power[("perfect", "UCB-HFD")] == ["—", "10", "—", "10", "1.000", "0", "1.000", "0", "1.000", "0"]
    assert power[("perfect", "UCB-CP")] == ["1.000", "0"] * 5
    correct = _markdown_rows(paper_table_markdown(results, "correct_coverage"))
    assert correct[("perfect", "UCB-CP")] == ["1.000", "0"] * 5


def _strip_rules(row: str) -> str:
    row = re.sub(r"\\(toprule|midrule|bottomrule)", "", row)
    return re.sub(r"\\cmidrule\(lr\)\{\d+-\d+\}", "", row).strip()


def check_latex_shape(tex: str) -> int:
    """Balanced environments and braces; every row of every tabular spans exactly the column spec. Returns #tables."""
    for env in ("table*", "tabular"):
        assert tex.count(f"\\begin{{{env}}}") == tex.count(f"\\end{{{env}}}")
    plain = tex.replace(r"\{", "").replace(r"\}", "")
    assert plain.count("{") == plain.count("}")
    tabulars = re.findall(r"\\begin\{tabular\}\{([^}]*)\}(.*?)\\end\{tabular\}", tex, re.S)
    for spec, body in tabulars:
        n_cols = len(re.findall(r"[lcr]", spec))
        pending_multirow = [0] * n_cols
        for raw in body.split(r"\\"):
            row = _strip_rules(raw)
            if not row:
                continue
            cells = row.replace(r"\&", "").split("&")
            width = sum(int(m.group(1)) if (m := re.search(r"\\multicolumn\{(\d+)\}", c)) else 1 for c in cells)
            assert width == n_cols, f"row spans {width} of {n_cols} columns: {row}"
            col = 0
            for cell in cells:
                if pending_multirow[col] > 0:  # rows covered by a \multirow above must leave the cell empty
                    assert cell.strip() == "", f"cell under a multirow is not empty: {row}"
                    pending_multirow[col] -= 1
                if m := re.search(r"\\multirow\{(\d+)\}", cell):
                    pending_multirow[col] = int(m.group(1)) - 1
                col += int(m.group(1)) if (m := re.search(r"\\multicolumn\{(\d+)\}", cell)) else 1
        assert not any(pending_multirow), "a \\multirow spans past the end of its table"
    return len(tabulars)


def test_latex_tables_are_well_formed() -> None:
    frame = pl.concat([_hand_frame(), _group("a_b&c", "other%set", np.arange(300) / 300,
                                             (np.arange(300) > 250).astype(int))])
    results = evaluate_groups(frame, ReportConfig(**FAST))
    for metric in ("fdr", "coverage", "correct_coverage"):
        tex = paper_table_latex(results, metric)
        assert check_latex_shape(tex) == 2  # one table per dataset
        assert r"a\_b\&c" in tex and r"other\%set" in tex
        assert "---" in tex  # every split failed somewhere


def test_latex_tables_compile(tmp_path: Path) -> None:
    results = evaluate_groups(_hand_frame(), ReportConfig(**FAST))
    _compile_if_possible(paper_table_latex(results, "fdr") + paper_table_latex(results, "coverage"), tmp_path)


def test_shape_check_catches_a_broken_row() -> None:
    results = evaluate_groups(_hand_frame(), ReportConfig(**FAST))
    tex = paper_table_latex(results, "fdr")
    broken = tex.replace(r"& UCB-CP &", r"& UCB-CP & extra &", 1)
    with pytest.raises(AssertionError):
        check_latex_shape(broken)


def _compile_if_possible(tex: str, tmp_path: Path) -> None:
    engine = next((e for e in ("pdflatex", "lualatex", "xelatex", "tectonic") if shutil.which(e)), None)
    if engine is None:
        pytest.skip("no TeX engine installed: the shape check above is the LaTeX test")
    doc = tmp_path / "tables.tex"
    doc.write_text("\\documentclass{article}\n\\usepackage{booktabs,multirow,graphicx}\n\\begin{document}\n"
                   + tex + "\n\\end{document}\n", encoding="utf-8")
    args = [engine, doc.name] if engine == "tectonic" else [engine, "-interaction=nonstopmode", "-halt-on-error",
                                                             doc.name]
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_results_match_evaluate_splits_per_group() -> None:
    rng = np.random.default_rng(3)
    s1, s2 = rng.random(400), rng.random(500)
    e1, e2 = (rng.random(400) < 0.4 * s1).astype(int), (rng.random(500) < 0.3 * s2).astype(int)
    frame = pl.concat([_group("m1", "d", s1, e1), _group("m2", "d", s2, e2, estimator="lp")])
    results = evaluate_groups(frame, ReportConfig(**FAST))
    assert results.height == 2 * 5 * 2
    for model, s, e in (("m1", s1, e1), ("m2", s2, e2)):
        expected = cic.evaluate_splits(s, e, n_splits=N_SPLITS, search="paper")
        got = results.filter(model=model).drop("model", "dataset", "estimator", "criterion", "cal_fraction", "seed")
        assert got.equals(expected)


def test_a_report_from_stored_rows_is_the_report_that_runs_the_protocol(tmp_path: Path) -> None:
    """Stored evaluation rows (shuffled, with ids, a search the report does not show and another seed's rows
    beside them) render the same tables as running the protocol; rows that miss a cell are not used."""
    rng = np.random.default_rng(4)
    s1, s2 = rng.random(300), rng.random(300)
    frame = pl.concat([_group("m1", "d", s1, (rng.random(300) < 0.4 * s1).astype(int)),
                       _group("m2", "d", s2, (rng.random(300) < 0.3 * s2).astype(int), estimator="lp")])
    config = ReportConfig(**{**FAST, "searches": ("geometric", "paper")})
    computed = evaluate_groups(frame, config)
    other_seed = evaluate_groups(frame, replace(config, seed=9, searches=("paper", "fixed_sequence")))
    stored = pl.concat([computed, other_seed]).sample(fraction=1.0, shuffle=True, seed=1).with_columns(
        evaluation_id=pl.lit("e1"))
    assert stored_results(frame, config, stored).equals(computed)
    write_report(frame, tmp_path / "ran", config)
    write_report(frame, tmp_path / "stored", config, stored=stored)
    for name in ("results.csv", "fdr.md", "coverage.tex", "correct_coverage.md"):
        assert (tmp_path / "stored" / "tables" / name).read_text() == (tmp_path / "ran" / "tables" / name).read_text()
    assert stored_results(frame, config, computed.filter(~((pl.col("model") == "m2") & (pl.col("alpha") == 0.1)))) \
        is None  # one cell missing: the report runs the protocol itself


def test_sensitivity_study_runs_each_fraction_on_its_own_splits() -> None:
    rng = np.random.default_rng(4)
    s = rng.random(600)
    e = (rng.random(600) < 0.3 * s).astype(int)
    table = sensitivity_study(_group("m", "d", s, e), ReportConfig(n_splits=8, sensitivity_fractions=(0.5, 0.1),
                                                                   sensitivity_alphas=(0.15,), searches=("paper",)))
    assert sorted(set(table["cal_fraction"])) == [0.1, 0.5]
    for f in (0.5, 0.1):
        expected = cic.evaluate_splits(s, e, alphas=[0.15], n_splits=8, cal_fraction=f, search="paper")
        assert table.filter(cal_fraction=f)["coverage_mean"].to_list() == expected["coverage_mean"].to_list()
    assert [ratio_label(f) for f in (0.5, 0.4, 0.3, 0.2, 0.1, 0.25)] == ["1:1", "2:3", "3:7", "1:4", "1:9", "1:3"]


def test_the_budget_curve_is_label_budget_per_group_and_alpha_and_says_where_labels_stop_paying() -> None:
    """Each row read back from `cic.stats.limits.label_budget` on the group's own table (sizes as multiples of
    it); the table names where more labels stop paying, and 'never' where the score cannot reach alpha."""
    from cic.reports.tables import budget_markdown
    from cic.stats.limits import label_budget, score_limit, stops_paying

    rng = np.random.default_rng(3)
    s = rng.random(400)
    wrong = (rng.random(400) < 0.03 + 0.4 * s).astype(int)
    wrong[np.argsort(s)[:10:2]] = 1  # half the ten surest wrong: no threshold reaches 0.02 in-sample
    frame = _group("m", "d", s, wrong)
    config = ReportConfig(alphas=(0.02, 0.15), budget_sizes=(0.5, 1, 2, 4), budget_draws=30)
    budget = budget_study(frame, config)
    assert budget.height == 2 * 4 and budget["labels"].unique().sort().to_list() == [200, 400, 800, 1600]
    u, e = frame["score"].to_numpy(), frame["error"].to_numpy()
    for alpha in (0.02, 0.15):
        expected = label_budget(u, e, alpha=alpha, sizes=[200, 400, 800, 1600], draws=30, seed=0)
        part = budget.filter(alpha=alpha).sort("labels")
        assert part["coverage"].to_list() == pytest.approx([p.mean_coverage for p in expected])
        assert part["certified_share"].to_list() == pytest.approx([p.certified_share for p in expected])
        assert part["score_limit"].to_list() == [score_limit(u, e, alpha)] * 4
    md = budget_markdown(budget)
    stop = stops_paying([200, 400, 800, 1600], budget.filter(alpha=0.15).sort("labels")["coverage"].to_list())
    row = next(line for line in md.splitlines() if line.startswith("| m | 400 | 0.15 |"))
    assert "| 0.5× | 1× | 2× | 4× |" in md and budget["multiple"].unique().sort().to_list() == [0.5, 1, 2, 4]
    assert row.endswith(f"| {'—' if stop is None else f'~{stop:,}'} |")
    assert score_limit(u, e, 0.02) == 0 and "| never: no threshold reaches α in-sample |" in md
    with pytest.raises(UserError, match=r"budget_sizes\[0\] = 0"):
        ReportConfig(budget_sizes=(0,))


def test_prr_study_one_row_per_group() -> None:
    frame = pl.concat([_group("m", "d", np.array([1.0, 2, 3, 4]), np.array([0, 0, 1, 1])),
                       _group("m", "d", np.array([1.0, 2, 3, 4]), np.array([1, 1, 0, 0]), estimator="bad")])
    prr = prr_study(frame)
    assert prr["estimator"].to_list() == ["se", "bad"]
    assert prr["prr"].to_list() == pytest.approx([1.0, -1.0])


@pytest.mark.parametrize("change,message", [
    (lambda f: f.drop("criterion"), "lacks column(s) criterion"),
    (lambda f: f.with_columns(error=pl.when(pl.int_range(pl.len()) == 3).then(2).otherwise(pl.col("error"))),
     "errors must be 0/1"),
    (lambda f: f.with_columns(score=pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("score"))),
     "column 'score' in table has a missing value at row 5"),
    (lambda f: f.with_columns(score=pl.when(pl.int_range(pl.len()) == 2).then(float("nan"))
                              .otherwise(pl.col("score"))), "scores must be finite"),
    (lambda f: f.with_columns(question_id=pl.lit("same")), "question_id 'same' appears more than once"),
    (lambda f: f.head(0), "has no rows"),
])
def test_bad_long_frames_are_refused_with_a_clear_message(change, message: str) -> None:
    frame = _group("m", "d", np.linspace(0, 1, 20), np.zeros(20, dtype=int))
    with pytest.raises(UserError, match=re.escape(message)):
        check_long_frame(change(frame))


def test_bad_config_is_refused() -> None:
    with pytest.raises(UserError, match="bonferroni' needs grid"):
        ReportConfig(searches=("bonferroni",))
    with pytest.raises(UserError, match=r"alphas\[1\] = 2"):
        ReportConfig(alphas=(0.1, 2))
    with pytest.raises(UserError, match="baseline = 'x'"):
        ReportConfig(baselines=("x",))
    with pytest.raises(UserError, match="unknown report setting"):
        write_report(_hand_frame(), "unused", n_split=3)


def test_write_report_writes_every_table_figure_and_an_index_that_links_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    parts = []
    for model in ("m1", "m2"):
        s = rng.random(400)
        parts.append(_group(model, "d", s, (rng.random(400) < 0.4 * s).astype(int)))
    out = tmp_path / "report"
    files = write_report(pl.concat(parts), out, n_splits=8, sensitivity_fractions=(0.5, 0.2), searches=("paper",))
    names = {p.as_posix() for p in files.all()}
    for name in ("README.md", "tables/fdr.md", "tables/fdr.tex", "tables/coverage.md", "tables/coverage.tex",
                 "tables/correct_coverage.md", "tables/results.csv", "tables/sensitivity.md", "tables/sensitivity.csv",
                 "tables/baselines.md", "tables/baselines.csv", "tables/prr.md", "tables/prr.csv",
                 "tables/budget.md", "tables/budget.csv",
                 "figures/fdr_vs_alpha.png", "figures/coverage_vs_alpha.png", "figures/sensitivity.png",
                 "figures/prr.png", "figures/budget.png",
                 "figures/risk_coverage_se_match.png"):
        assert name in names
        assert (out / name).stat().st_size > 0
    for png in out.glob("figures/*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (out / "README.md").read_text()
    linked = re.findall(r"\]\(([^)]+)\)", index)
    assert set(linked) >= {"tables/fdr.tex", "figures/prr.png", "tables/baselines.md"}
    assert all((out / link).exists() for link in linked)
    assert "| LLM | UCB / α |" in index  # the FDR table is rendered inline
    baselines = pl.read_csv(out / "tables" / "baselines.csv")
    assert baselines.height == 2 * 5 * 8  # 2 groups x 5 alphas x (4 CIC searches + 4 baselines)


def test_write_report_refuses_a_file_as_directory(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(UserError, match="exists and is not a directory"):
        write_report(_hand_frame(), target, **FAST)
    assert target.read_text() == "x"


def test_reusing_the_main_results_changes_nothing() -> None:
    rng = np.random.default_rng(9)
    s = rng.random(500)
    frame = _group("m", "d", s, (rng.random(500) < 0.35 * s).astype(int))
    config = ReportConfig(n_splits=6, sensitivity_fractions=(0.5, 0.3), sensitivity_alphas=(0.1, 0.2))
    results = evaluate_groups(frame, config)
    assert sensitivity_study(frame, config, results).equals(sensitivity_study(frame, config))
    assert baselines_study(frame, config, results).equals(baselines_study(frame, config))


def test_committed_example_report_is_current(tmp_path: Path) -> None:
    """infra/examples/report (shown in the README) is what `cic report --search paper` writes today for the demo
    table."""
    from cic.store.score_files import read_long_table

    root = Path(__file__).resolve().parents[2] / "infra" / "examples"
    frame = read_long_table(root / "scores_demo.csv", labels={"model": "demo-model", "dataset": "demo"})
    write_report(frame, tmp_path, figures=False, searches=("paper",))  # the paper's tables: `--search paper`
    for fresh in sorted((tmp_path / "tables").iterdir()):
        assert fresh.read_text() == (root / "report" / "tables" / fresh.name).read_text(), fresh.name


@pytest.mark.slow
def test_committed_real_example_report_is_reproduced_by_its_table(tmp_path: Path) -> None:
    """infra/examples/real/report is what `cic report TABLE --search paper --no-figures` writes from the committed
    table."""
    from cic.store.score_files import read_long_table

    root = Path(__file__).resolve().parents[2] / "infra" / "examples" / "real"
    write_report(read_long_table(root / "qwen2.5-coder-1.5b.parquet"), tmp_path, figures=False, searches=("paper",))
    for fresh in sorted((tmp_path / "tables").iterdir()):
        assert fresh.read_text() == (root / "report" / "tables" / fresh.name).read_text(), fresh.name


def test_a_summary_never_prints_negative_zero() -> None:
    result = cic.calibrate(np.zeros(400) * -1.0, np.zeros(400), alpha=0.2)
    assert "score <= 0:" in result.summary() and "-0" not in result.summary()


def test_each_search_is_its_own_line_in_the_metric_against_alpha_figures() -> None:
    """Parent figures drew fixed_sequence and paper as one zig-zag line with one legend entry."""
    from cic.reports.figures import curve_keys

    one_group = pl.DataFrame({"dataset": ["d"] * 4, "estimator": ["e"] * 4, "criterion": ["c"] * 4,
                              "model": ["m"] * 4, "search": ["fixed_sequence", "paper"] * 2,
                              "alpha": [0.1, 0.1, 0.2, 0.2]})
    assert curve_keys(one_group) == ["search"]
    two_groups = one_group.with_columns(pl.Series("estimator", ["e", "e", "f", "f"]))
    keys = curve_keys(two_groups)
    assert "search" in keys and "estimator" in keys
    assert two_groups.select(keys).n_unique() == 4  # every (estimator, search) its own line
    assert curve_keys(one_group.filter(search="paper")) != ["search"]  # one search: no split needed
