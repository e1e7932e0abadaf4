"""`cic ask`: answer one new question with a stored gate, or abstain, showing the score and the threshold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from cic import schema


@dataclass(frozen=True)
class Reply:
    """The decision for one question, with what it rests on."""

    decision: str
    answer: str
    score: float
    threshold: float | None
    estimator: str
    calibration_id: str


def question_row(question: str, dataset: str, choices: Sequence[str] | None) -> pl.DataFrame:
    """A one-row QUESTIONS frame for a user's question (multiple choice when options are given)."""
    if not question.strip():
        raise ValueError("question = '': ask something")
    labels = [chr(ord("A") + i) for i in range(len(choices))] if choices else None
    return schema.conform(pl.DataFrame({
        "dataset": [dataset], "split": ["ask"], "question_id": ["ask-" + schema.value_hash(question, choices)[:12]],
        "question": [question], "choices": [list(choices) if choices else None], "choice_labels": [labels],
        "answer": [""], "aliases": [[]]}, schema=schema.QUESTIONS.schema), schema.QUESTIONS)


def latest_gate(db: str, *, model: str, dataset: str, estimator: str, criterion: str | None, alpha: float,
                bound: str, search: str) -> dict:
    """The newest stored calibration of that key (estimator by stored or base name)."""
    from cic.store import Store

    with Store.open(db, read_only=True) as store:
        rows = store.read("calibrations", model=model, dataset=dataset, bound=bound, search=search)
    rows = rows.filter((pl.col("alpha") - alpha).abs() < 1e-12)
    rows = rows.filter((pl.col("estimator") == estimator) | (pl.col("estimator").str.split("[").list.first() ==
                                                               estimator))
    if criterion:
        rows = rows.filter(criterion=criterion)
    if rows.height == 0:
        raise ValueError(f"no stored gate for model={model!r}, dataset={dataset!r}, estimator={estimator!r}, "
                         f"criterion={criterion!r}, alpha={alpha:g}, bound={bound!r}, search={search!r} in {db}; "
                         "run `cic run` (or `cic calibrate`) with these settings first")
    row = rows.sort("created_at").row(-1, named=True)
    verify_gate(row)
    return row


def verify_gate(row: dict) -> None:
    """Refuse a stored gate that disagrees with its own stored result, or whose certificate does not hold:
    the threshold, alpha, delta, bound and search columns must equal the result JSON's, and a threshold
    needs (n_errors, n_accepted) whose upper bound at the result's level is <= alpha."""
    import math

    from cic.stats.bounds import ucb
    from cic.stats.calibration import CalibrationResult

    name = f"stored gate {str(row.get('calibration_id'))[:12]}"
    try:
        result = CalibrationResult.from_json(row["result_json"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{name}: its stored result does not parse ({exc}); refusing to serve it") from None
    for column in ("threshold", "alpha", "delta", "bound", "search", "n_accepted", "n_errors"):
        stored, certified = row.get(column), getattr(result, column)
        same = stored == certified or (isinstance(stored, float) and isinstance(certified, float)
                                       and math.isclose(stored, certified, rel_tol=1e-12))
        if not same:
            raise ValueError(f"{name}: column {column} = {stored!r} but its certified result says {certified!r}; "
                             "the row was altered — refusing to serve it (recalibrate to replace it)")
    if result.threshold is not None:
        value = float(ucb(result.bound, result.n_errors, result.n_accepted, result.gamma))
        if not value <= result.alpha * (1 + 1e-12):
            raise ValueError(f"{name}: its certificate does not hold (UCB {value:.4g} > alpha {result.alpha:g}); "
                             "refusing to serve it")


def ask_question(question: str, *, config_path: str | Path, db: str | None, model: str | None, dataset: str,
                 choices: Sequence[str] | None, estimator: str, criterion: str | None, alpha: float, bound: str,
                 search: str) -> Reply:
    """Generate the answer and its samples with the config's model, score it, apply the stored gate."""
    from dataclasses import replace

    from cic.llm.answering import Answerer
    from cic.pipeline.config import load_config
    from cic.stats.gate import Gate

    config = load_config(config_path)
    names = [m.name for m in config.models]
    index = names.index(model) if model in names else 0
    if model is not None and model not in names:
        raise ValueError(f"model = {model!r}: not in the config; choose from {names}")
    gate_row = latest_gate(db or config.storage.db, model=names[index], dataset=dataset, estimator=estimator,
                           criterion=criterion, alpha=alpha, bound=bound, search=search)
    settings = config.answerer_settings(index)
    base = gate_row["estimator"].split("[")[0]
    answerer = Answerer(replace(settings, estimators=(base,)))
    questions = question_row(question, dataset, choices)
    generations = answerer.generate(questions, run_key="ask")
    scores = answerer.scorer.score(generations, run_key="ask").filter(estimator=gate_row["estimator"])
    if scores.height == 0 or scores.get_column("value")[0] is None:
        raise ValueError(f"estimator {gate_row['estimator']!r} gives no score for this question")
    score = float(scores.get_column("value")[0])
    gate = Gate(gate_row["threshold"])
    answer = generations.filter(sample_index=0).get_column("text")[0]
    return Reply(gate.decide(score), answer, score, gate_row["threshold"], gate_row["estimator"],
                 gate_row["calibration_id"])
