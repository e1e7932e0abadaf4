"""The risk-control arena (`cic.reports.arena`, `cic bench`): every method judged on the same splits, the rates it
reports recomputed here from the splits themselves, conformal selection against a brute-force Benjamini–Hochberg,
and the command as a user runs it (files written, bad input one line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import cic
from cic.cli import app
from cic.errors import UserError
from cic.reports.arena import EXPECTATION, METHODS, PAC, run_arena, score_select
from cic.stats.curves import rejection_curve

runner = CliRunner()


def applicable(estimator: str = "s") -> set[str]:
    """The methods the arena runs on a score of this name (MAPIE's multiclass only on the top option's)."""
    return {m.name for m in METHODS.values() if not m.estimators or estimator in m.estimators}


def table(n: int = 600, seed: int = 0, dataset: str = "d") -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    e = (rng.random(n) < 0.05 + 0.5 * u).astype(int)
    return pl.DataFrame({"model": "m", "dataset": dataset, "estimator": "s", "criterion": "c",
                         "question_id": [f"q{i}" for i in range(n)], "score": u, "error": e})


def test_each_row_is_what_its_method_does_on_the_same_splits() -> None:
    """The arena's coverage, mean FDR, P(FDR > α) and accepts-nothing share equal a recomputation from the splits
    `cic.split_masks` draws for the same seed, for CIC's default and for LEC."""
    frame = table()
    rows = run_arena(frame, alphas=[0.2], n_splits=20, seed=3)
    assert rows.height == len(applicable()) and set(rows.get_column("method")) == applicable()
    u, e = frame.get_column("score").to_numpy(), frame.get_column("error").to_numpy()
    masks = cic.split_masks(u.shape[0], 20, 0.5, seed=3)
    for name, search in (("cic", "fallback"), ("lec", "lec")):
        cover, fdr = [], []
        for cal in masks:
            t = cic.calibrate(u[cal], e[cal], alpha=0.2, delta=0.05, search=search, keep_table=False).threshold
            accepted = np.zeros((~cal).sum(), dtype=bool) if t is None else u[~cal] <= t
            cover.append(accepted.mean())
            fdr.append(e[~cal][accepted].mean() if accepted.any() else 0.0)
        row = rows.filter(method=name).row(0, named=True)
        assert row["coverage"] == pytest.approx(np.mean(cover)) and row["mean_fdr"] == pytest.approx(np.mean(fdr))
        assert row["p_fdr_above_alpha"] == pytest.approx(np.mean(np.array(fdr) > 0.2))
        assert row["accepts_nothing"] == pytest.approx(np.mean(np.array(cover) == 0))
    kinds = dict(rows.select("method", "guarantee").iter_rows())
    assert kinds["cic"] == PAC and kinds["lec"] == EXPECTATION and kinds["score-select"] == EXPECTATION


def test_a_guarantee_in_expectation_exceeds_alpha_far_more_often_than_a_pac_one() -> None:
    """The point of the P(FDR > α) column: on one law, the PAC rules exceed α in few splits, LEC and conformal
    selection in about half (their mean FDR sits at α)."""
    rows = run_arena(table(4000, seed=1), alphas=[0.15], n_splits=60)
    above = dict(rows.select("method", "p_fdr_above_alpha").iter_rows())
    assert max(above["cic"], above["cic-hoeffding"], above["bonferroni-grid"]) < 0.2
    assert min(above["lec"], above["score-select"]) > 0.25


def test_conformal_selection_is_benjamini_hochberg_on_conformal_p_values() -> None:
    rng = np.random.default_rng(4)
    u, e, test = rng.random(50), (rng.random(50) < 0.4).astype(int), rng.random(30)
    n = u.shape[0]
    p = np.array([(1 + np.sum((e == 1) & (u <= t))) / (n + 1) for t in test])
    k = max((i for i in range(1, 31) if np.sort(p)[i - 1] <= 0.3 * i / 30), default=0)
    expected = p <= np.sort(p)[k - 1] if k else np.zeros(30, dtype=bool)
    assert (score_select(u, e, test, 0.3, 0.05) == expected).all()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"alphas": [1.5]}, "alpha = 1.5"), ({"alphas": [0.1], "deltas": [0.0]}, "delta = 0.0"),
    ({"alphas": [0.1], "n_splits": 0}, "n_splits = 0"), ({"alphas": [0.1], "methods": ["magic"]}, "magic"),
])
def test_bad_settings_are_one_line_naming_them(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        run_arena(table(50), **kwargs)


def test_cic_bench_prints_the_table_and_writes_it_with_its_figure(tmp_path: Path) -> None:
    data = tmp_path / "scores.parquet"
    pl.concat([table(), table(seed=2, dataset="other")]).write_parquet(data)
    done = runner.invoke(app, ["bench", str(data), "--alphas", "0.2,0.3", "--n-splits", "10", "--dataset", "d",
                               "--out", str(tmp_path / "arena")])
    assert done.exit_code == 0, done.output
    assert "| m | d | s | c | 0.2 | 0.05 | cic | PAC (1 − δ) |" in done.output and "| other |" not in done.output
    written = pl.read_csv(tmp_path / "arena" / "arena.csv")
    assert written.height == 2 * len(applicable()) and (tmp_path / "arena" / "arena.png").stat().st_size > 10_000
    assert (tmp_path / "arena" / "arena.md").read_text().count("\n") == 2 + 2 * len(applicable())
    ranking = pl.read_csv(tmp_path / "arena" / "ranking.csv")  # how the score ranks, read back from the curves
    u, e = pl.read_parquet(data).filter(dataset="d").select("score", "error")
    curve = rejection_curve(u.to_numpy(), e.to_numpy())
    assert ranking.height == 1 and ranking["auarc"][0] == pytest.approx(curve.auarc)
    assert ranking["prr"][0] == pytest.approx(curve.prr) and ranking["ece"][0] is None  # 's' is no probability
    assert f"| {curve.prr:.3f} | {curve.auarc:.4f} | — |" in done.output
    unknown = runner.invoke(app, ["bench", str(data), "--dataset", "nope"])
    assert unknown.exit_code == 2 and "--dataset = 'nope': not in the tables" in unknown.output
    inside = runner.invoke(app, ["bench", str(data), "--out", str(tmp_path)])  # the input lies in --out
    assert inside.exit_code == 2 and (tmp_path / "scores.parquet").exists()


def test_cic_bench_says_what_each_score_cost_in_generations_where_the_table_says(tmp_path: Path) -> None:
    """A `generations` column (one-pass 1, ten samples 11, an adaptive score its drawn counts) becomes the
    arena's generations a question, per group; a table without it prints a dash, not a made-up cost."""
    cheap, adaptive = table(), table(seed=2).with_columns(estimator=pl.lit("s[adaptive:4-10]"))
    drawn = np.where(np.arange(adaptive.height) % 3 == 0, 11, 5)
    data = tmp_path / "scores.parquet"
    pl.concat([cheap.with_columns(generations=pl.lit(1, dtype=pl.Int64)),
               adaptive.with_columns(generations=pl.Series(drawn))]).write_parquet(data)
    rows = run_arena(pl.read_parquet(data), alphas=[0.2], methods=["cic"], n_splits=5)
    assert dict(zip(rows.get_column("estimator"), rows.get_column("generations_per_question"), strict=True)) == \
        pytest.approx({"s": 1.0, "s[adaptive:4-10]": float(drawn.mean())})
    done = runner.invoke(app, ["bench", str(data), "--alphas", "0.2", "--n-splits", "5", "--methods", "cic"])
    assert done.exit_code == 0 and f"| {drawn.mean():.2f} |" in done.output and "| 1.00 |" in done.output
    bare = tmp_path / "bare.parquet"
    cheap.write_parquet(bare)
    plain = runner.invoke(app, ["bench", str(bare), "--alphas", "0.2", "--n-splits", "5", "--methods", "cic"])
    arena_part = plain.output.split("How each score ranks")[0]
    assert plain.exit_code == 0 and "generations / question" in arena_part and arena_part.count("| — |") == 1
    bad = tmp_path / "bad.parquet"
    cheap.with_columns(generations=pl.lit(0)).write_parquet(bad)
    refused = runner.invoke(app, ["bench", str(bad)])
    assert refused.exit_code == 2 and "column 'generations'" in refused.output and "has 0 at row 0" in refused.output


def test_mapies_controllers_join_the_arena_exactly_where_mapie_is_installed() -> None:
    from cic.reports import arena_mapie

    assert ("mapie-binary" in METHODS) == ("mapie-multiclass" in METHODS) == arena_mapie.installed()


@pytest.mark.skipif("mapie-binary" not in METHODS, reason="MAPIE is not installed (pip install mapie==1.6.0)")
def test_mapies_rows_are_its_controllers_on_the_same_splits_and_multiclass_only_for_the_top_option_score() -> None:
    """mapie-binary accepts what MAPIE's own controller certifies on each calibration part; mapie-multiclass runs
    only on 1 − max option probability, where its accept/abstain decisions equal the binary controller's grid
    rule on the same λ grid or are more permissive (it picks the λ that abstains least)."""
    from mapie.risk_control import BinaryClassificationController

    frame = table(800, seed=5).with_columns(estimator=pl.lit("one_minus_max_prob"))
    rows = run_arena(pl.concat([frame, frame.with_columns(estimator=pl.lit("other"))]), alphas=[0.3], n_splits=5)
    assert set(rows.filter(estimator="other").get_column("method")) == applicable("other") == set(METHODS) - {
        "mapie-multiclass"}
    u, e = frame.get_column("score").to_numpy(), frame.get_column("error").to_numpy()
    masks = cic.split_masks(u.shape[0], 5, 0.5, seed=0)
    cover = []
    for cal in masks:
        controller = BinaryClassificationController(
            predict_function=lambda x: np.column_stack([x[:, 0], 1.0 - x[:, 0]]), risk="precision",
            target_level=0.7, confidence_level=0.95)
        controller.calibrate(u[cal].reshape(-1, 1), (e[cal] == 0).astype(int))
        best = controller.best_predict_param
        cover.append(0.0 if best is None else float(np.mean(1.0 - u[~cal] >= float(best))))
    row = rows.filter(estimator="one_minus_max_prob", method="mapie-binary").row(0, named=True)
    assert row["coverage"] == pytest.approx(np.mean(cover), abs=1e-9)


def test_a_plain_score_error_file_is_benched_under_its_file_name_and_absurd_settings_are_one_line(
        tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    table().select("score", "error").write_csv(plain)
    done = runner.invoke(app, ["bench", str(plain), "--n-splits", "5", "--alphas", "0.3"])
    assert done.exit_code == 0, done.output
    assert "| model | plain | score | error | 0.3 | 0.05 | cic |" in done.output
    for args, said in ((["--n-splits", "0"], "n_splits = 0"), (["--cal-fraction", "1"], "cal_fraction = 1.0"),
                       (["--out", "/dev/null"], "is a character device")):
        refused = runner.invoke(app, ["bench", str(plain), *args])
        assert refused.exit_code == 2 and said in refused.output, refused.output


@pytest.mark.parametrize("alphas", [[0.2], [0.1, 0.2, 0.3]])
def test_the_figures_legend_and_labels_stay_inside_it_and_one_alpha_draws_a_bar_per_method(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alphas: list[float]) -> None:
    """The README's `cic bench` clipped its legend at both ends (seven long labels in one row); with one α the
    methods were dots on a 0.19–0.21 axis. Every text of the figure lies inside it, and one α draws bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cic.reports import arena, figures

    rows = run_arena(table(600, seed=2), alphas=alphas, n_splits=10)
    mapie = [rows.filter(method="lec").with_columns(method=pl.lit(name), guarantee=pl.lit("PAC (1 − δ)"))
             for name in ("mapie-ltt-precision", "mapie-binary-classifier")]  # seven methods, as where MAPIE is
    rows = pl.concat([rows, *mapie])
    drawn: list[Figure] = []
    keep = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: (drawn.append(fig), keep(fig, path))[1])
    arena.arena_figure(rows, tmp_path / "arena.png")
    (fig,) = drawn
    renderer = FigureCanvasAgg(fig).get_renderer()
    inside = fig.bbox.padded(1)
    shown = [(ax, t) for ax in fig.axes if ax.get_visible() for t in ax.get_xticklabels()]
    texts = [fig.legends[0], *[t for ax, t in shown if min(ax.get_xlim()) <= t.get_position()[0] <= max(ax.get_xlim())]]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, text
    bars = sum(len(ax.patches) for ax in fig.axes)
    assert (bars > 0) == (len(alphas) == 1)
