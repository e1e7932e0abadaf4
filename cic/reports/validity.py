"""The validity study: Monte-Carlo violation rates of every search and bound against delta, with exact CIs.

Each configuration (scenario, n, alpha, search, bound) runs `cic.simulate` on calibration sets drawn from a
model whose selection-conditioned risk R(t) is known in closed form, and counts R(t_hat) > alpha. The
scenarios scale with alpha so every alpha poses the same question:

- `crossing`: R(t) = 2 alpha t (PowerRisk(0, 4 alpha)), which crosses alpha at t = 0.5 — a certificate is
  wrong when the threshold lands beyond 0.5;
- `flat`: R(t) = 1.2 alpha everywhere — alpha is unattainable and every certificate is a violation, the
  case where searching many candidates at level delta (`search="paper"`) is most exposed.

Bonferroni uses a grid fixed in advance: `grid_size` evenly spaced thresholds over [0.05, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.registry import Registry
from cic.stats._validation import check_open_unit, check_positive_int
from cic.stats.bounds import resolve_bound
from cic.stats.calibration import uniform_grid
from cic.stats.searches import SEARCH_NAMES, get_search
from cic.stats.simulation import PowerRisk, simulate

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Scenario:
    """A family of risk models indexed by alpha."""

    name: str
    description: str
    model: Callable[[float], PowerRisk]


def _crossing(alpha: float) -> PowerRisk:
    if 4 * alpha > 1:
        raise UserError(f"alpha = {alpha!r}: the crossing scenario R(t) = 2 alpha t needs alpha <= 0.25")
    return PowerRisk(0.0, 4 * alpha, 1.0)


def _flat(alpha: float) -> PowerRisk:
    if 1.2 * alpha > 1:
        raise UserError(f"alpha = {alpha!r}: the flat scenario R = 1.2 alpha needs alpha <= 1/1.2")
    return PowerRisk(1.2 * alpha, 1.2 * alpha, 1.0)


SCENARIOS: Registry[Scenario] = Registry("scenario", (
    Scenario("crossing", "R(t) = 2α·t, crosses α at t = 0.5", _crossing),
    Scenario("flat", "R(t) = 1.2α everywhere: α unattainable", _flat),
))


def validity_study(*, scenarios: Sequence[str] = tuple(SCENARIOS), ns: Sequence[int] = (200, 1000, 5000),
                   alphas: Sequence[float] = (0.1, 0.2), searches: Sequence[str] = SEARCH_NAMES,
                   bounds: Sequence[str] = ("hoeffding", "cp"), delta: float = 0.05, n_trials: int = 2000,
                   seed: int = 0, grid_size: int = 20) -> pl.DataFrame:
    """One row per (scenario, n, alpha, search, bound) with the violation rate and its exact 95% interval.

    Columns: scenario, description, n, alpha, delta, search, bound, n_trials, n_violations, violation_rate,
    ci_low, ci_high, verdict ("below delta", "consistent with delta", "exceeds delta"), fails,
    mean_coverage, oracle_coverage. Every configuration uses the same seed (paired draws across searches).
    """
    import polars as pl

    for name in scenarios:
        SCENARIOS.lookup(name)
    delta = check_open_unit(delta, "delta")
    n_trials = check_positive_int(n_trials, "n_trials")
    grid = uniform_grid(0.05, 1.0, check_positive_int(grid_size, "grid_size"))
    checked_bounds = [resolve_bound(b) for b in bounds]
    for s in searches:
        get_search(s)
    if not (scenarios and ns and alphas and searches and bounds):
        raise UserError("scenarios, ns, alphas, searches and bounds must each hold at least one value")
    rows: list[dict[str, Any]] = []
    for name in scenarios:
        scenario = SCENARIOS[name]
        for alpha in alphas:
            model = scenario.model(check_open_unit(alpha, "alpha"))
            for n in ns:
                for search in searches:
                    for bound in checked_bounds:
                        res = simulate(model, n=check_positive_int(n, "n"), alpha=alpha, delta=delta, bound=bound,
                                       search=search, n_trials=n_trials, seed=seed,
                                       grid=grid if get_search(search).needs_grid else None)
                        rows.append({"scenario": name, "description": scenario.description, "n": n,
                                     "alpha": alpha, "delta": delta, "search": search, "bound": bound,
                                     "n_trials": n_trials, "n_violations": res.n_violations,
                                     "violation_rate": res.violation_rate, "ci_low": res.ci_low,
                                     "ci_high": res.ci_high, "verdict": res.verdict, "fails": res.fails,
                                     "mean_coverage": res.mean_coverage, "oracle_coverage": res.oracle_coverage})
    return pl.DataFrame(rows)


def write_validity(out_dir: str | Path, *, figure: bool = True, **study: Any) -> tuple[pl.DataFrame, list[Path]]:
    """Run `validity_study(**study)` and write validity.csv, validity.md, validity.png and README.md."""
    from cic.reports.tables import validity_markdown
    from cic.store.outputs import write_frame, write_text

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"out_dir = {str(out)!r}: exists and is not a directory")
    table = validity_study(**study)
    out.mkdir(parents=True, exist_ok=True)
    write_frame(table, out / "validity.csv", "--out")
    body = validity_markdown(table)
    write_text(out / "validity.md", body, "--out")
    written = [out / "validity.csv", out / "validity.md"]
    if figure:
        from cic.reports.figures import validity_figure

        written.append(validity_figure(table, out / "validity.png"))
    first = table.row(0, named=True)
    scen = "\n".join(f"- `{s.name}`: {s.description}" for s in SCENARIOS.values()
                     if s.name in set(table["scenario"]))
    index = (f"# CIC validity study\n\nMonte-Carlo: {first['n_trials']:,} calibration sets per row; violation = "
             f"R(t̂) > α for the certified threshold t̂ (no threshold is never a violation); 95% Clopper–Pearson "
             f"interval on the rate; δ = {first['delta']:g}. \"exceeds δ\" means the whole interval lies above δ.\n\n"
             f"Scenarios (U ~ Uniform(0, 1)):\n\n{scen}\n\n"
             + ("![violation rates](validity.png)\n\n" if figure else "") + body
             + "\nFiles: [validity.csv](validity.csv), [validity.md](validity.md)\n")
    write_text(out / "README.md", index, "--out")
    written.append(out / "README.md")
    return table, written
