"""Adaptive rounds through an engine (the replay engine of tests/support, recorded answers): every round's open
questions in one call, stops where the rule says, rows stored in drawn order, no label read, the scorer's replay
of the rule on a full draw equal to the rounds' own scores, and the settings that name it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from cic.errors import UserError
from cic.llm.answering import Answerer, generations_drawn
from cic.llm.engines import ENGINES
from cic.llm.generation import GenerationConfig
from cic.llm.rounds import draw_in_rounds
from cic.llm.settings import AnswererSettings
from cic.llm.uncertainty import make_equivalence

ROUNDS = (2, 4, 6, 10)
SAMPLES = {  # the ten samples of each question, in drawn order; the greedy answer is the first sample's text
    "agrees": ["Paris"] * 10,                              # settled after round one: 2 samples
    "split": ["red", "blue"] + ["red"] * 8,                # two meanings at once: all 10
    "late": ["cat", "cat"] + ["dog"] * 8,                  # agrees first, disagrees later: 2 (the rule never looks)
    "spread": [f"answer {i}" for i in range(10)],          # four that all differ: 4
}


@pytest.fixture
def replay(tmp_path: Path) -> Iterator[Path]:
    """The replay engine registered, and a file of every question's greedy answer and ten samples."""
    path = tmp_path / "answers.jsonl"
    rows = [{"question_id": q, "sample_index": i, "text": texts[max(i - 1, 0)], "logprob_sum": -0.1 * (i + 1)}
            for q, texts in SAMPLES.items() for i in range(11)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ENGINES.register("tests.support.replay_engine:ReplayEngine", name="replay")
    yield path
    ENGINES.unregister("replay")


def answerer(path: Path, adaptive: tuple[int, ...] | None = ROUNDS) -> Answerer:
    settings = AnswererSettings(model_spec="replay", engine="replay", engine_options={"file": str(path)},
                                generation=GenerationConfig(n_samples=10, adaptive=adaptive), equivalence="exact",
                                estimators=("semantic_entropy", "num_semantic_sets", "answer_nll"))
    return Answerer(settings)


def questions(answers: dict[str, str]) -> pl.DataFrame:
    from cic import schema

    n = len(answers)
    frame = pl.DataFrame({"dataset": ["trivia_qa"] * n, "split": ["validation"] * n, "question_id": list(answers),
                          "question": [f"{q}?" for q in answers], "choices": [None] * n, "choice_labels": [None] * n,
                          "answer": list(answers.values()), "aliases": [[a] for a in answers.values()]},
                         schema=schema.QUESTIONS.schema)
    return schema.conform(frame, schema.QUESTIONS)


def test_every_round_asks_its_open_questions_in_one_call_and_stops_where_the_rule_says(replay: Path) -> None:
    worker = answerer(replay)
    worker.engine.load()
    drawn = draw_in_rounds(worker.engine, list(SAMPLES), [""] * 4, run_key="k", rounds=ROUNDS,
                           equivalence=make_equivalence("exact"))
    assert worker.engine.calls == [(list(SAMPLES), [0, 1, 2]), (["split", "spread"], [3, 4]),
                                   (["split"], [5, 6]), (["split"], [7, 8, 9, 10])]
    assert drawn.asked == [4, 2, 1, 1]
    per = dict(drawn.rows.group_by("question_id").agg(pl.col("sample_index")).iter_rows())
    assert {q: sorted(v) for q, v in per.items()} == {"agrees": [0, 1, 2], "late": [0, 1, 2],
                                                      "split": list(range(11)), "spread": list(range(5))}
    assert generations_drawn(drawn.rows) == 3 + 3 + 11 + 5


def test_a_question_that_loses_a_round_keeps_no_row_so_a_rerun_asks_it_whole(replay: Path) -> None:
    kept = [json.loads(line) for line in replay.read_text().splitlines()]
    replay.write_text("\n".join(json.dumps(r) for r in kept if not (r["question_id"] == "split"
                                                                   and r["sample_index"] > 2)) + "\n")
    worker = answerer(replay)
    worker.engine.load()
    drawn = draw_in_rounds(worker.engine, list(SAMPLES), [""] * 4, run_key="k", rounds=ROUNDS,
                           equivalence=make_equivalence("exact"))
    assert "split" not in set(drawn.rows.get_column("question_id")) and drawn.rows.height == 3 + 3 + 5


def test_permuting_the_labels_leaves_every_stop_unchanged(replay: Path) -> None:
    """The whole answering stage under adaptive rounds, once with each question's own reference answer and once
    with them permuted: the labels change, every generated row (so every stop) and every score stays."""
    worker = answerer(replay)
    own = {q: texts[0] for q, texts in SAMPLES.items()}
    permuted = dict(zip(own, list(own.values())[1:] + list(own.values())[:1], strict=True))
    first = worker.process(questions(own), run_key="k", criteria=["exact_match"])
    second = worker.process(questions(permuted), run_key="k", criteria=["exact_match"])
    assert not first.labels.sort("question_id").equals(second.labels.sort("question_id"))
    assert first.generations.sort("question_id", "sample_index").equals(
        second.generations.sort("question_id", "sample_index"))
    assert first.scores.sort("question_id", "estimator").equals(second.scores.sort("question_id", "estimator"))
    assert first.stats["generations"] == 3 + 3 + 11 + 5


def test_the_scorers_replay_on_a_full_draw_equals_the_rounds_own_scores(replay: Path) -> None:
    worker = answerer(replay)
    adaptive = worker.process(questions({q: "x" for q in SAMPLES}), run_key="k", criteria=["exact_match"])
    full = answerer(replay, adaptive=None)
    every = full.generate(questions({q: "x" for q in SAMPLES}), run_key="k")
    assert every.height == 4 * 11
    replayed = worker.scorer.score(every, run_key="k")
    assert adaptive.scores.sort("question_id", "estimator").equals(replayed.sort("question_id", "estimator"))
    names = set(replayed.get_column("estimator"))
    assert names == {"semantic_entropy[exact][adaptive:2-10]", "num_semantic_sets[exact][adaptive:2-10]",
                     "answer_nll"}  # the one-pass score reads no sample: its name and value stay
    values = {(q, e): v for q, e, v in replayed.select("question_id", "estimator", "value").iter_rows()}
    assert values["agrees", "num_semantic_sets[exact][adaptive:2-10]"] == 1
    assert values["late", "num_semantic_sets[exact][adaptive:2-10]"] == 1  # its samples 3-10 never drawn
    assert values["spread", "num_semantic_sets[exact][adaptive:2-10]"] == 4
    assert values["split", "num_semantic_sets[exact][adaptive:2-10]"] == 2
    whole = full.scorer.score(every, run_key="k")
    assert whole.filter(question_id="late", estimator="num_semantic_sets[exact]")["value"][0] == 2


def test_a_multiple_choice_question_reads_every_letter_drawn_they_cost_no_generation(replay: Path) -> None:
    """Its letters are draws from one forward pass: the adaptive score of a choice question is the full one (the
    rule would only throw free samples away), and its cost is one generation."""
    worker, full = answerer(replay), answerer(replay, adaptive=None)
    letters = ["A", "B", "C", "D", "E", "A", "A", "A", "A", "A"]  # four that all differ: a free-text stop
    rows = pl.DataFrame([{"run_key": "k", "question_id": "mc", "sample_index": i, "text": (["A"] + letters)[i],
                          "n_tokens": 1, "logprob_sum": -1.0, "logprob_mean": -1.0, "is_greedy": i == 0,
                          "option_probs": [0.6, 0.1, 0.1, 0.1, 0.1], "flags": []} for i in range(11)])
    from cic import schema

    rows = schema.conform(rows, schema.GENERATIONS)
    adaptive_sets = worker.scorer.score(rows, run_key="k").filter(estimator="num_semantic_sets[exact][adaptive:2-10]")
    assert adaptive_sets["value"].to_list() == full.scorer.score(rows, run_key="k").filter(
        estimator="num_semantic_sets[exact]")["value"].to_list() == [5]  # the fifth letter: not cut at four
    assert generations_drawn(rows) == 1


def test_samples_that_end_before_the_rule_stops_score_null_not_a_guess(replay: Path) -> None:
    worker = answerer(replay)
    every = answerer(replay, adaptive=None).generate(questions({"split": "x"}), run_key="k")
    cut = worker.scorer.score(every.filter(pl.col("sample_index") <= 4), run_key="k")
    assert cut.filter(estimator="semantic_entropy[exact][adaptive:2-10]")["value"][0] is None
    assert cut.filter(estimator="answer_nll")["value"][0] is not None


def test_adaptive_rounds_are_named_checked_and_keyed() -> None:
    plain, rounds = GenerationConfig(n_samples=10), GenerationConfig(n_samples=10, adaptive=[2, 4, 6, 10])
    assert "adaptive" not in plain.shaping()  # a run keyed before adaptive rounds existed keeps its key
    assert rounds.shaping()["adaptive"] == [2, 4, 6, 10] and rounds.adaptive == ROUNDS
    with pytest.raises(UserError, match=r"adaptive = \[2, 4\]: its last round draws 4 samples, n_samples = 10"):
        GenerationConfig(n_samples=10, adaptive=(2, 4))
    with pytest.raises(UserError, match="adaptive: rounds = "):
        GenerationConfig(n_samples=10, adaptive=(1, 10))


def test_the_config_names_the_rounds_in_every_score_that_reads_samples(tmp_path: Path) -> None:
    from cic.pipeline.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("models: [{name: m, spec: x}]\ndatasets: [{name: trivia_qa}]\n"
                    "generation: {n_samples: 10, adaptive: [2, 4, 6, 10]}\n"
                    "uncertainty: {estimators: [semantic_entropy, eigv, answer_nll_mean]}\n")
    config = load_config(path)
    assert config.uncertainty.score_names(config.generation.adaptive) == (
        "semantic_entropy[embedding:0.9][adaptive:2-10]", "eigv[embedding:0.9][adaptive:2-10]", "answer_nll_mean")
    path.write_text(path.read_text().replace("n_samples: 10", "n_samples: 6"))
    with pytest.raises(UserError, match="n_samples = 6"):
        load_config(path)
