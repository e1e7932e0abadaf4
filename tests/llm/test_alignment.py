"""Alignment criteria: parsing, option match, exact match, token F1 and MiniLM similarity on the greedy answer."""

from __future__ import annotations

import polars as pl
import pytest

from cic import schema
from cic.errors import UserError
from cic.llm.alignment import default_criteria, label_generations, parse_criterion
from cic.llm.text import normalize_answer, rouge_l, token_f1


def questions() -> pl.DataFrame:
    return schema.conform(pl.DataFrame({
        "dataset": ["d", "d", "m"], "split": "validation", "question_id": ["q1", "q2", "q3"],
        "question": ["Capital of France?", "Who wrote Hamlet?", "Pick"],
        "choices": [None, None, ["x", "y", "z"]], "choice_labels": [None, None, ["A", "B", "C"]],
        "answer": ["Paris", "William Shakespeare", "B"], "aliases": [["Paris, France"], ["Shakespeare"], []]},
        schema=schema.QUESTIONS.schema), schema.QUESTIONS)


def greedy(texts: dict[str, str]) -> pl.DataFrame:
    return schema.conform(pl.DataFrame({
        "run_key": "r", "question_id": list(texts), "sample_index": 0, "text": list(texts.values()), "n_tokens": 1,
        "logprob_sum": -1.0, "logprob_mean": -1.0, "is_greedy": True, "option_probs": None, "flags": [[]] * len(texts),
        "hidden": None},
        schema=schema.GENERATIONS.schema), schema.GENERATIONS)


def test_parse_and_defaults() -> None:
    assert parse_criterion("similarity").label == "similarity[0.6]"
    assert parse_criterion("token_f1[0.8]").threshold == 0.8
    assert default_criteria(True) == ["option_match"] and default_criteria(False) == ["similarity[0.6]"]
    for bad, message in (("bleu", "unknown"), ("similarity[x]", "not a number"), ("option_match[1]", "no parameter"),
                         ("similarity[2]", r"\[0, 1\]")):
        with pytest.raises(UserError, match=message):
            parse_criterion(bad)


def test_squad_normalisation_f1_and_rouge() -> None:
    assert normalize_answer("The  Beatles!") == "beatles"
    assert token_f1("William Shakespeare", "Shakespeare") == pytest.approx(2 / 3)
    assert rouge_l("x b c d", "x c d") == pytest.approx(2 * 0.75 * 1 / 1.75)
    assert rouge_l("a b c d", "a c d") == pytest.approx(0.8)  # the article "a" is dropped first


def test_lexical_criteria_and_option_match() -> None:
    labels = label_generations(questions(), greedy({"q1": "paris.", "q2": "Shakespeare, of course", "q3": "B"}),
                               ["option_match", "exact_match", "token_f1[0.5]"], run_key="r")
    got = {(r["question_id"], r["criterion"]): (r["aligned"], r["value"]) for r in labels.iter_rows(named=True)}
    assert got[("q3", "option_match")] == (True, 1.0)
    assert ("q1", "option_match") not in got and ("q3", "exact_match") not in got  # criteria that do not apply
    assert got[("q1", "exact_match")] == (True, 1.0) and got[("q2", "exact_match")][0] is False
    assert got[("q2", "token_f1[0.5]")] == (True, pytest.approx(0.5))
    assert labels.get_column("run_key").unique().to_list() == ["r"]


def test_similarity_needs_an_embedder() -> None:
    with pytest.raises(UserError, match="needs a sentence embedder"):
        label_generations(questions(), greedy({"q1": "Paris"}), ["similarity[0.6]"], run_key="r")


@pytest.mark.slow
def test_similarity_takes_the_best_reference_with_minilm(minilm) -> None:
    labels = label_generations(questions(), greedy({"q1": "Paris, France", "q2": "a banana", "q3": "A"}),
                               ["similarity[0.6]", "option_match"], run_key="r", embedder=minilm)
    got = {(r["question_id"], r["criterion"]): (r["aligned"], r["value"]) for r in labels.iter_rows(named=True)}
    assert got[("q1", "similarity[0.6]")][0] is True and got[("q1", "similarity[0.6]")][1] == pytest.approx(1.0)
    assert got[("q2", "similarity[0.6]")][0] is False
    assert got[("q3", "option_match")] == (False, 0.0)
