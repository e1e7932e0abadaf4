"""Generation with SmolLM2-135M on CPU: shapes, determinism, batch independence, value ranges and flags."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from cic import schema
from cic.data import build_prompt, load_questions
from cic.errors import UserError
from cic.llm.generation import SAMPLER, AnswerGenerator, GenerationConfig, generate_for_questions

pytestmark = pytest.mark.slow


def prompts_for(questions: pl.DataFrame, tokenizer) -> list[str]:
    return [build_prompt(r, tokenizer=tokenizer) for r in questions.iter_rows(named=True)]


@pytest.fixture(scope="module")
def trivia(smollm) -> tuple[pl.DataFrame, list[str]]:
    q = load_questions("trivia_qa", limit=20, seed=0)
    return q, prompts_for(q, smollm.tokenizer)


def test_config_validation_and_shaping() -> None:
    with pytest.raises(UserError, match="top_p = 1.5"):
        GenerationConfig(top_p=1.5)
    shaping = GenerationConfig(batch_size=8).shaping()
    assert "batch_size" not in shaping and shaping["sampler"] == SAMPLER


def test_open_ended_rows_shapes_ranges_determinism(smollm, trivia) -> None:
    q, prompts = trivia[0].head(8), trivia[1][:8]
    gen = AnswerGenerator(smollm, GenerationConfig(n_samples=3, max_new_tokens=10, seed=1))
    rows = generate_for_questions(gen, q, prompts, run_key="r")
    assert rows.columns == list(schema.GENERATIONS.columns) and rows.height == 8 * 4
    assert rows.group_by("question_id").len().get_column("len").unique().to_list() == [4]
    assert rows.filter(pl.col("is_greedy")).get_column("sample_index").unique().to_list() == [0]
    assert (rows.get_column("logprob_sum") <= 0).all() and (rows.get_column("n_tokens") <= 10).all()
    assert rows.get_column("option_probs").is_null().all()
    assert all(("empty" in f) == (t == "") for f, t in zip(rows["flags"], rows["text"], strict=True))
    again = generate_for_questions(AnswerGenerator(smollm, GenerationConfig(n_samples=3, max_new_tokens=10, seed=1)),
                                   q, prompts, run_key="r")
    assert again.equals(rows)
    other = generate_for_questions(AnswerGenerator(smollm, GenerationConfig(n_samples=3, max_new_tokens=10, seed=2)),
                                   q.head(5), prompts[:5], run_key="r")
    first_five = pl.col("question_id").is_in(q.head(5)["question_id"].to_list()) & (pl.col("sample_index") > 0)
    assert other.filter(pl.col("sample_index") > 0)["text"].to_list() != rows.filter(first_five)["text"].to_list()


def test_a_questions_rows_do_not_depend_on_its_batch(smollm, trivia) -> None:
    """On CPU in fp32 a question's tokens are identical alone, in a batch of 6, or in chunks of 2 questions;
    log-probabilities agree to float32 rounding (padding changes the matmul shapes)."""
    q, prompts = trivia
    config = GenerationConfig(n_samples=3, max_new_tokens=8, seed=0)
    columns = ["question_id", "sample_index", "text", "n_tokens", "flags"]
    alone = pl.concat([generate_for_questions(AnswerGenerator(smollm, config), q[i:i + 1], prompts[i:i + 1],
                                              run_key="r") for i in range(6)])
    batched = generate_for_questions(AnswerGenerator(smollm, config), q[:6], prompts[:6], run_key="r")
    chunked_generator = AnswerGenerator(smollm, GenerationConfig(n_samples=3, max_new_tokens=8, seed=0,
                                                                 batch_size=8))
    chunked = generate_for_questions(chunked_generator, q[:6], prompts[:6], run_key="r")
    assert chunked_generator.n_forward_calls >= 3 * 2  # three chunks of two questions, several steps each
    for other in (batched, chunked):
        assert other.select(columns).equals(alone.select(columns))
    for other in (batched, chunked):
        assert np.abs(other["logprob_sum"].to_numpy() - alone["logprob_sum"].to_numpy()).max() < 1e-4


def test_a_round_draws_what_a_draw_of_every_row_drew_at_its_indices(smollm, trivia) -> None:
    """Adaptive rounds ask rows by index (`indices`): each row's noise is keyed by its own index, so the rounds of
    a question together store the prefix of the rows one full draw stores — the later round decoding from the
    first round's kept prefill."""
    q, prompts = trivia[0].head(4), trivia[1][:4]
    config = GenerationConfig(n_samples=6, max_new_tokens=8, seed=0)
    columns = ["question_id", "sample_index", "text", "n_tokens", "is_greedy"]
    full = AnswerGenerator(smollm, config).generate_open(q["question_id"].to_list(), prompts, run_key="r")
    generator = AnswerGenerator(smollm, config)
    rounds = pl.concat([generator.generate_open(q["question_id"].to_list()[:n], prompts[:n], run_key="r",
                                                indices=indices) for n, indices in ((4, [0, 1, 2]), (2, [3, 4]))])
    prefix = full.filter((pl.col("sample_index") <= 2) | pl.col("question_id").is_in(q["question_id"][:2].to_list())
                         & (pl.col("sample_index") <= 4))
    assert rounds.sort("question_id", "sample_index").select(columns).equals(
        prefix.sort("question_id", "sample_index").select(columns))
    assert generator.prefills_reused == 1  # the second round decoded from the first round's prefill, not its own


def test_rows_stop_at_newline_or_run_to_the_token_budget(smollm, trivia) -> None:
    q, prompts = trivia
    rows = generate_for_questions(AnswerGenerator(smollm, GenerationConfig(n_samples=5, max_new_tokens=12)),
                                  q[:6], prompts[:6], run_key="r")
    assert not any("\n" in t for t in rows["text"])
    ran_out = rows.filter(pl.col("flags").list.contains("max_tokens"))
    stopped = rows.filter(~pl.col("flags").list.contains("max_tokens"))
    assert (ran_out["n_tokens"] == 12).all() and (stopped["n_tokens"] < 12).all() and stopped.height > 0
    free = generate_for_questions(
        AnswerGenerator(smollm, GenerationConfig(n_samples=5, max_new_tokens=12, stop_at_newline=False)),
        q[:6], prompts[:6], run_key="r")
    assert free.filter(pl.col("flags").list.contains("max_tokens")).height > ran_out.height


def test_most_likely_row_is_the_greedy_continuation(smollm, trivia) -> None:
    import torch

    q, prompts = trivia
    rows = generate_for_questions(AnswerGenerator(smollm, GenerationConfig(n_samples=2, max_new_tokens=6)),
                                  q[:2], prompts[:2], run_key="r")
    for i in range(2):
        ids = smollm.tokenizer(prompts[i], add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = smollm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=6, pad_token_id=smollm.tokenizer.pad_token_id)
        greedy = smollm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0].strip()
        assert rows.filter(question_id=q["question_id"][i], sample_index=0)["text"][0] == greedy


def test_default_ten_samples_and_truncation_flag(smollm, trivia) -> None:
    q, prompts = trivia
    gen = AnswerGenerator(smollm, GenerationConfig(max_new_tokens=6, max_context_tokens=40))
    rows = generate_for_questions(gen, q[:2], prompts[:2], run_key="r")
    assert rows.height == 2 * 11
    assert all("prompt_truncated" in f for f in rows["flags"])


def test_multiple_choice_distribution_and_samples(smollm) -> None:
    q = load_questions("commonsense_qa", limit=20, seed=0)
    gen = AnswerGenerator(smollm, GenerationConfig(n_samples=4))
    rows = generate_for_questions(gen, q, prompts_for(q, smollm.tokenizer), run_key="r")
    assert rows.height == 20 * 5
    probs = np.array(rows.get_column("option_probs").to_list())
    assert np.allclose(probs.sum(axis=1), 1.0) and probs.shape[1] == 5
    greedy = rows.filter(sample_index=0)
    assert greedy["text"].to_list() == ["ABCDE"[int(np.argmax(p))] for p in np.array(greedy["option_probs"].to_list())]
    assert set(rows["text"]) <= set("ABCDE") and (rows["n_tokens"] == 1).all()
