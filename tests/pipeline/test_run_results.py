"""The typed results every surface renders: a system gate's thresholds read the same on each of them."""

from __future__ import annotations

from cic.pipeline.run.run_results import CandidateRow, GroupPlace, stage_thresholds


def test_a_stage_without_a_threshold_reads_never_on_every_surface_that_prints_stages() -> None:
    """The candidates table (`CandidateRow.shown`), the gate list, `cic gate promote`, the serving-now table and the
    drift alert all print a system's stages through `stage_thresholds`: in order, 'never' for a stage that never
    answers; a candidate that certifies nothing reads 'unattainable'."""
    assert stage_thresholds([1e-9, None, 0.5]) == "1e-09 / never / 0.5"
    place = GroupPlace("a -> b", "d", "e", "c", 0.2, "cp", "fixed_sequence")
    row = CandidateRow(place, "g" * 16, "candidate", None, 400, None, [], (0.25, None), (0.3, 0.9))
    assert (row.shown(), row.shown(live=True), row.unattainable) == ("0.25 / never", "0.3 / 0.9", False)
    nothing = CandidateRow(place, "h" * 16, "candidate", None, 400, None, [])
    assert (nothing.shown(), nothing.shown(live=True), nothing.unattainable) == ("unattainable", None, True)


def test_the_digest_says_what_each_question_cost_in_generations() -> None:
    """The run digest's cost line reads generations a question from what the answer stage counted: 11 with ten
    samples, fewer under adaptive rounds; a model that only re-scored stored answers is not named."""
    from cic.pipeline.run.run_digest import generated_line
    from cic.pipeline.run.run_results import AnswerStats, PipelineSummary

    summary = PipelineSummary(db="x.duckdb", tracking_uri="", report_dir="r", experiment_prefix="p")
    summary.answer = [AnswerStats("full", generated=20, generations=220, tokens=681),
                      AnswerStats("adaptive", generated=20, generations=134, tokens=406),
                      AnswerStats("rescored", questions=20)]
    assert generated_line(summary) == ("Generated this run: full 20 question(s), 11.00 generations a question, 681 "
                                       "tokens; adaptive 20 question(s), 6.70 generations a question, 406 tokens.")
    assert AnswerStats("none").generations_per_question == 0.0


def test_the_digest_says_whether_the_score_or_the_labels_keep_an_alpha_out_of_reach() -> None:
    """An unattainable cell's digest line carries the score's limit and any rule's ceiling stored with its
    evaluation, and the cause they imply; a row stored before limits were kept says nothing of them."""
    from cic.pipeline.run.run_digest import digest_lines
    from cic.pipeline.run.run_results import PipelineSummary, ResultRow

    def row(dataset: str, limit: float | None) -> ResultRow:
        return ResultRow("m", dataset, "se", "match", 0.05, "cp", "fallback", None, None, 0.0, 100, 100, 0.05, 150,
                         0.3, limit, None if limit is None else 0.737)

    summary = PipelineSummary(db="x.duckdb", tracking_uri="", report_dir="r", experiment_prefix="p")
    summary.results = [row("hopeless", 0.0), row("short", 0.12), row("old", None)]
    lines = {line.split(":")[0]: line for line in digest_lines(summary) if line.startswith("- ")}
    assert lines["- m · hopeless"].endswith("This score's limit 0.000, any rule's ceiling 0.737: no threshold on this "
                                            "score reaches it even in-sample: a better score or a looser α, not more "
                                            "labels.")
    assert "This score's limit 0.120, any rule's ceiling 0.737: the score reaches it in-sample, so too few labels" \
        in lines["- m · short"]
    assert "limit" not in lines["- m · old"]
