"""`cic ask`: answer one new question with the live gate, or abstain, showing the score and the threshold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from cic import schema
from cic.errors import UserError


@dataclass(frozen=True)
class Reply:
    """The decision for one question, with what it rests on."""

    decision: str
    answer: str
    score: float
    threshold: float | None
    estimator: str
    calibration_id: str
    withheld: str | None = None  # why the key's gate serves nothing (unattainable, flagged, no guarantee)


def question_row(question: str, dataset: str, choices: Sequence[str] | None) -> pl.DataFrame:
    """A one-row QUESTIONS frame for a user's question (multiple choice when options are given)."""
    if not question.strip():
        raise UserError("question = '': ask something")
    labels = [chr(ord("A") + i) for i in range(len(choices))] if choices else None
    return schema.conform(pl.DataFrame({
        "dataset": [dataset], "split": ["ask"], "question_id": ["ask-" + schema.value_hash(question, choices)[:12]],
        "question": [question], "choices": [list(choices) if choices else None], "choice_labels": [labels],
        "answer": [""], "aliases": [[]]}, schema=schema.QUESTIONS.schema), schema.QUESTIONS)


def serving_gate(db: str, *, model: str, dataset: str, estimator: str, criterion: str | None, alpha: float,
                 bound: str, search: str) -> dict:
    """The live gate of that key (`cic.pipeline.gates.live_gate`), read without locking the store."""
    from cic.pipeline.gates import live_gate
    from cic.store import Store

    with Store.open(db, read_only=True, wait_s=60) as store:
        return live_gate(store, model=model, dataset=dataset, estimator=estimator, criterion=criterion,
                         alpha=alpha, bound=bound, search=search)


def certified_identity(db: str, gate_row: dict, engine: str) -> str | None:
    """The identity the gate's answers were generated under (a served model: what its server said it serves),
    read from the gate's run key as its engine wrote it; None where the spec alone keys the run."""
    import json

    from cic.llm.engines import engine_class
    from cic.store import Store

    with Store.open(db, read_only=True, wait_s=60) as store:
        runs = store.read("runs", run_key=gate_row["run_key"])
    if runs.height == 0:
        return None
    return engine_class(engine).certified_identity(json.loads(runs.get_column("generation_config")[0]))


def ask_question(question: str, *, config_path: str | Path, db: str | None, model: str | None, dataset: str,
                 choices: Sequence[str] | None, estimator: str, criterion: str | None, alpha: float, bound: str,
                 search: str) -> Reply:
    """Generate the answer and its samples with the config's model, score it, apply the stored gate."""
    from dataclasses import replace

    from cic.llm.answering import Answerer
    from cic.llm.engines import EngineProbe
    from cic.pipeline.config import load_config
    from cic.pipeline.gates import gate_of

    config = load_config(config_path)
    names = [m.name for m in config.models]
    index = names.index(model) if model in names else 0
    if model is not None and model not in names:
        raise UserError(f"model = {model!r}: not in the config; choose from {names}")
    gate_row = serving_gate(db or config.storage.db, model=names[index], dataset=dataset, estimator=estimator,
                           criterion=criterion, alpha=alpha, bound=bound, search=search)
    settings = config.answerer_settings(index)
    # the gate holds only for the model it was certified on: the engine probes and refuses another
    expected = certified_identity(db or config.storage.db, gate_row, settings.engine)
    settings = replace(settings, estimators=(gate_row["estimator"].split("[")[0],),
                       probe=EngineProbe(identity=expected) if expected is not None else None)
    answerer = Answerer(settings)
    questions = question_row(question, dataset, choices)
    generations = answerer.generate(questions, run_key="ask")
    if failures := answerer.engine.take_failures():
        raise UserError(f"model {names[index]}: the endpoint gave no answer ({next(iter(failures.values()))})")
    scores = answerer.scorer.score(generations, run_key="ask").filter(estimator=gate_row["estimator"])
    if scores.height == 0 or scores.get_column("value")[0] is None:
        raise UserError(f"estimator {gate_row['estimator']!r} gives no score for this question")
    score = float(scores.get_column("value")[0])
    why = gate_row.get("withheld")
    threshold = None if why is not None else gate_row["threshold"]  # a gate out of service answers nothing
    answer = generations.filter(sample_index=0).get_column("text")[0]
    return Reply(gate_of(gate_row).decide(score), answer, score, threshold, gate_row["estimator"],
                 gate_row["calibration_id"], why)
