"""How a pipeline run reads: its digest (models × datasets, certified cells, why the others are unattainable),
the Markdown summary of its Prefect artifact, the sentence the console prints when every α failed, and the
per-dataset study in one line per gate. The CLI and the flow's artifacts both render from here."""

from __future__ import annotations

from collections.abc import Sequence

from cic.pipeline.run.run_results import PipelineSummary, ResultRow, SystemResultRow
from cic.stats.bounds import min_certifiable_n
from cic.stats.limits import cause_clause

RESULTS_ARTIFACT = "cic-pipeline-results"
REAL_EXAMPLE = "infra/examples/real/README.md"
PER_DATASET_UNSHARED = ("per dataset: every dataset's gate is certified at δ / G with its model's other datasets, "
                        "but no estimator × criterion is shared by two datasets of a model (each dataset labels with "
                        "its own criterion), so there is no per-dataset table comparing them with a pooled gate")


def zero_errors_need(alpha: float, delta: float) -> str:
    """Why a small calibration set cannot certify alpha, whatever the model."""
    return (f"even with zero errors Clopper–Pearson needs {min_certifiable_n('cp', alpha, delta)} accepted answers "
            f"to certify α = {alpha:g} at δ = {delta:g}")


def unattainable_note(rows: Sequence[ResultRow]) -> str | None:
    """One sentence on why every alpha of these cells failed (base error, calibration size), or None when
    something certified."""
    if not rows or any(r.certified for r in rows):
        return None
    errors = [r.base_error_rate for r in rows]
    return (f"Every α was unattainable: the base error rate is {min(errors):.2f}–{max(errors):.2f} and each split "
            f"calibrates on {min(r.n_cal for r in rows)} answers, while "
            f"{zero_errors_need(max(r.alpha for r in rows), rows[0].delta)}. A stronger model on more questions "
            f"certifies: see {REAL_EXAMPLE}.")


def generated_line(summary: PipelineSummary) -> str | None:
    """What generating cost this run, per model that generated (questions, generations a question, tokens); None
    when nothing was."""
    spent = [a for a in summary.answer if a.generated]
    return ("Generated this run: " + "; ".join(f"{a.model} {a.generated} question(s), "
                                               f"{a.generations_per_question:.2f} generations a question, "
                                               f"{a.tokens} tokens"
                                               + (f" ({a.moved} request(s) moved to another replica)" if a.moved
                                                  else "") for a in spent) + ".") if spent else None


def probes_line(summary: PipelineSummary) -> str | None:
    """What the probe stage did (fitted, kept, and every run or criterion it skipped with why); None when the
    config fits no probe."""
    stats = summary.probes
    if stats is None:
        return None
    return (f"Probes: {len(stats.fitted)} fitted, {len(stats.kept)} kept from an earlier run"
            + "".join(f"; skipped {why}" for why in stats.skipped) + ".")


def limits_clause(row: ResultRow) -> str:
    """Why an unattainable cell is (`cic.stats.limits`): the score, when no threshold on it reaches alpha even
    in-sample; else too few labels (`cic calibrate` estimates how many). Empty for rows stored without limits."""
    if row.score_limit is None or row.ceiling is None:
        return ""
    clause = cause_clause(row.score_limit, row.ceiling)
    return f" {clause[0].upper()}{clause[1:]}."


def digest_lines(summary: PipelineSummary) -> list[str]:
    """The run in a few sentences: models × datasets, how many result cells certify, why the others do not,
    where the MLflow runs are."""
    results = summary.results
    models = [a.model for a in summary.answer]
    datasets = sorted({r.dataset for r in results})
    failed = [a.model for a in summary.failed_models]
    lines = [f"**{len(models)} model(s) × {len(datasets)} dataset(s)**: {', '.join(models) or 'none'} on "
             f"{', '.join(datasets) or 'no dataset'}" + (f"; failed: {', '.join(failed)}" if failed else "") + "."]
    lines += [line for line in (generated_line(summary), probes_line(summary)) if line]
    if results:
        certified = [r for r in results if r.certified]
        lines.append(f"**{len(certified)} of {len(results)} result cells certify** (model × dataset × estimator × "
                     "criterion × α × bound × search in which some calibration split found a threshold).")
        worst: dict[tuple[str, str], ResultRow] = {}
        for r in results:
            key = (r.model, r.dataset)
            if not r.certified and (key not in worst or r.alpha >= worst[key].alpha):
                worst[key] = r
        for (model, dataset), r in sorted(worst.items()):
            cells = [c for c in results if (c.model, c.dataset) == (model, dataset)]
            lines.append(f"- {model} · {dataset}: {sum(not c.certified for c in cells)} of {len(cells)} cells "
                         f"unattainable, up to α = {r.alpha:g} ({r.estimator}, {r.bound}, {r.search}): base error "
                         f"rate {r.base_error_rate:.2f}, {r.n_cal} answers per calibration split, and "
                         f"{zero_errors_need(r.alpha, r.delta)}.{limits_clause(r)}")
    if summary.log is not None:
        experiments = ", ".join(f"{summary.experiment_prefix}-{d}" for d in datasets)
        lines.append(f"MLflow: {summary.tracking_uri}, experiments {experiments} "
                     f"({summary.log.logged} group(s) logged, {summary.log.already} already there).")
    elif summary.log_error:
        lines.append(f"MLflow logging failed: {summary.log_error} (run `cic log`).")
    return lines


def stage_times(summary: PipelineSummary) -> str:
    return ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in summary.stage_seconds.items())


def per_dataset_digest(rows: Sequence[dict]) -> list[tuple[str, str, str, float | None, int]]:
    """Per (model, dataset, gate): the largest share of splits whose test FDR exceeded α over every estimator,
    criterion, bound and α, and how many rows that covers — the per-dataset table in one line each."""
    worst: dict[tuple[str, str, str], tuple[float | None, int]] = {}
    for r in rows:
        key = (r["model"], r["dataset"], r["gate"])
        share, count = worst.get(key, (None, 0))
        value = r["fdr_above_alpha"]
        if value is not None and (share is None or value > share):
            share = value
        worst[key] = (share, count + 1)
    return [(*key, share, count) for key, (share, count) in sorted(worst.items())]


def per_dataset_lines(summary: PipelineSummary) -> list[str]:
    """The console's per-dataset lines: one per (model, dataset, gate), then where the table is."""
    lines = [f"per dataset: {model} · {dataset} · "
             f"{'per-dataset gate (δ/G)' if gate == 'per_group' else 'pooled gate'}: largest share of splits with "
             f"test FDR > α {'—' if share is None else f'{share:.2f}'} over {count} rows"
             for model, dataset, gate, share, count in per_dataset_digest(summary.per_dataset)]
    if summary.per_dataset_file:
        lines.append(f"per-dataset table: {summary.per_dataset_file}")
    if summary.per_dataset_note:
        lines.append(summary.per_dataset_note)
    return lines


def system_cells(rows: Sequence[SystemResultRow]) -> list[tuple[str, ...]]:
    """Per system gate: (system, dataset · criterion, α, bound, the gate, test FDR mean, share of splits with
    FDR > α, coverage, stage shares, fails) as text — the closing table's and the digest's rows."""
    cells = []
    for r in rows:
        gate = ("certifies nothing" if not r.certified else ", ".join(
            f"{m} ≤ {t:.4g}" if t is not None else f"{m} never" for m, t in zip(r.models, r.thresholds, strict=True))
            + (f" ({r.estimators[0]})" if r.estimators else ""))
        shares = " / ".join(f"{s:.2f}" for s in r.shares_mean) or "—"
        cells.append((r.system, f"{r.dataset} · {r.criterion}", f"{r.alpha:g}", r.bound, gate, _num(r.fdr_mean),
                      "—" if r.fdr_above_alpha is None else f"{r.fdr_above_alpha:.0%}", _num(r.coverage_mean), shares,
                      "—" if r.fails is None else f"{r.fails}/{r.n_splits}"))
    return cells


SYSTEM_COLUMNS = ("system", "dataset · criterion", "α", "bound", "gate on all questions", "test FDR",
                  "> α", "coverage", "stage shares", "fails")


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def markdown_summary(summary: PipelineSummary) -> str:
    """The run's digest first, then its models and stage times, for the Prefect UI; every split-protocol row is
    in the table artifact `cic-pipeline-results`."""
    lines = ["# CIC pipeline run", "", *digest_lines(summary), ""]
    if summary.results:
        lines += [f"Every split-protocol row: the table artifact `{RESULTS_ARTIFACT}` of this run.", ""]
    lines += ["| model | questions | generated | tokens | actors | placement | status |",
              "|---|---|---|---|---|---|---|"]
    for a in summary.answer:
        lines.append(f"| {a.model} | {a.questions} | {a.generated} | {a.tokens} | {a.actors} | {a.options} | "
                     f"{'FAILED: ' + a.error if a.error else 'ok'} |")
    lines += ["", "stages: " + stage_times(summary)]
    if summary.per_dataset:
        lines += ["", "Per dataset (`group_by: dataset`): per-dataset gates certified at once (δ / G each) beside "
                  "the pooled gate; the largest share of splits with test FDR > α over every estimator, α and bound "
                  f"(full table: {summary.per_dataset_file}):", "",
                  "| model | dataset | gate | largest share FDR > α | rows |", "|---|---|---|---|---|"]
        for model, dataset, gate, share, count in per_dataset_digest(summary.per_dataset):
            shown = "—" if share is None else f"{share:.2f}"
            lines.append(f"| {model} | {dataset} | {'per dataset' if gate == 'per_group' else 'pooled'} | {shown} | "
                         f"{count} |")
    if summary.per_dataset_note:
        lines += ["", summary.per_dataset_note]
    if summary.systems:
        lines += ["", "Systems — cascades and estimators chosen, each certified as one system (error among "
                  "answered ≤ α with probability ≥ 1 − δ); split protocol on the same questions:", "",
                  "| " + " | ".join(SYSTEM_COLUMNS) + " |", "|" + "---|" * len(SYSTEM_COLUMNS)]
        lines += ["| " + " | ".join(cells) + " |" for cells in system_cells(summary.systems)]
    return "\n".join(lines) + "\n"
