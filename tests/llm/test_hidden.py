"""Hidden states kept from the greedy pass (`generation.keep_hidden`): the layers asked for, at the last prompt
token and the last answer token fed back, equal to an independent forward pass over the same tokens; the answers
themselves unchanged; nothing kept on sampled rows; bad layer lists refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from cic.errors import UserError
from cic.llm.generation import AnswerGenerator, GenerationConfig
from cic.llm.hidden import check_layers, feature_matrix, pack, unpack


def test_layers_are_checked_and_resolved_against_the_model() -> None:
    assert check_layers((-1, 3), n_layers=30) == (30, 3) and check_layers((0,), n_layers=2) == (0,)
    for bad, words in [((1, 1), "at most 8 distinct"), (tuple(range(9)), "at most 8 distinct"),
                       ((1.5,), "layers are integers"), ((True,), "layers are integers")]:
        with pytest.raises(UserError, match=words):
            check_layers(bad)
    with pytest.raises(UserError, match=r"keep_hidden = \[31\]: layer 31 is not in this model \(0..30"):
        check_layers((31,), n_layers=30)
    with pytest.raises(UserError, match="two entries name the same layer"):
        check_layers((-1, 30), n_layers=30)


def test_a_block_packs_as_float16_and_reads_back_as_features() -> None:
    rng = np.random.default_rng(0)
    prompt, answer = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    block = unpack(pack(prompt, answer), 3)
    assert block.dtype == np.float16 and block.shape == (2, 3, 5)
    assert np.allclose(block[0], prompt, atol=2e-3) and np.allclose(block[1], answer, atol=2e-3)
    rows = feature_matrix([pack(prompt, answer), pack(answer, prompt)], 3, positions=("answer",))
    assert rows.shape == (2, 15) and np.allclose(rows[0], answer.reshape(-1), atol=2e-3)
    with pytest.raises(UserError, match="1 question"):
        feature_matrix([pack(prompt, answer), None], 3)
    with pytest.raises(UserError, match="does not hold 2 x 4 layers"):
        unpack(pack(prompt, answer), 4)


def test_keeping_states_keys_its_own_run_and_leaves_other_run_keys_alone() -> None:
    plain = GenerationConfig(n_samples=2).shaping()
    assert "keep_hidden" not in plain  # runs keyed before the field existed keep their keys
    assert GenerationConfig(n_samples=2, keep_hidden=(-1, 4)).shaping()["keep_hidden"] == [-1, 4]


def test_a_config_keeping_states_for_a_served_model_is_refused() -> None:
    from cic.pipeline.config import parse_config

    raw = {"models": [{"name": "served", "endpoint": {"urls": ["http://localhost:1/v1"], "model": "m"}}],
           "datasets": [{"name": "trivia_qa"}], "generation": {"keep_hidden": [-1]}}
    with pytest.raises(UserError, match="generation.keep_hidden = \\[-1\\]: model 'served' is not loaded here"):
        parse_config(raw)
    with pytest.raises(UserError, match="keep_hidden"):
        parse_config({**raw, "models": [{"name": "local", "spec": "x"}], "generation": {"keep_hidden": [2, 2]}})


def _independent(smollm, ids: list[int], layers: tuple[int, ...]) -> np.ndarray:
    """The kept layers at the last of `ids`, from one unpadded forward pass of its own."""
    import torch

    with torch.inference_mode():
        out = smollm.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return np.stack([out.hidden_states[layer][0, -1].float().numpy() for layer in layers])


def _close(kept: np.ndarray, expected: np.ndarray) -> bool:
    cosine = (kept * expected).sum(-1) / (np.linalg.norm(kept, axis=-1) * np.linalg.norm(expected, axis=-1))
    return bool(np.all(cosine > 0.999)) and bool(np.allclose(kept, expected, rtol=2e-2, atol=5e-2))


@pytest.mark.slow  # SmolLM2 on CPU
def test_kept_states_equal_a_forward_pass_of_their_own_and_the_answers_do_not_change(smollm) -> None:
    from cic.data import build_prompt, load_questions
    from cic.llm.generation import generate_for_questions

    questions = load_questions("trivia_qa", limit=6, seed=0)
    prompts = [build_prompt(r, tokenizer=smollm.tokenizer) for r in questions.iter_rows(named=True)]
    settings = {"n_samples": 2, "max_new_tokens": 12, "seed": 3}
    kept_gen = AnswerGenerator(smollm, GenerationConfig(**settings, keep_hidden=(-1, 4)))
    kept = generate_for_questions(kept_gen, questions, prompts, run_key="k")
    plain = generate_for_questions(AnswerGenerator(smollm, GenerationConfig(**settings)), questions, prompts,
                                   run_key="k")
    assert kept.drop("hidden").equals(plain.drop("hidden")) and plain["hidden"].is_null().all()
    greedy = kept.filter(kept["sample_index"] == 0)
    assert kept.filter(kept["sample_index"] > 0)["hidden"].is_null().all()
    assert greedy["hidden"].is_not_null().all()
    layers, width = kept_gen.kept_layers, smollm.model.config.hidden_size
    assert layers == (smollm.model.config.num_hidden_layers, 4)
    assert {len(b) for b in greedy["hidden"]} == {2 * 2 * width * 2}  # positions x layers x width x float16
    encoded, _ = kept_gen._encode(prompts)
    rows = kept_gen._decode_chunk(encoded, list(questions["question_id"]), [0])
    checked_answers = 0
    for qi, (ids, question) in enumerate(zip(encoded, rows, strict=True)):
        block = unpack(greedy["hidden"][qi], 2).astype(np.float32)
        assert question[0]["hidden"] is not None
        assert _close(block[0], _independent(smollm, list(ids), layers))  # the last prompt token
        tokens = question[0]["tokens"]
        fed = tokens if question[0]["stopped"] else tokens[:-1]  # the token a cut answer ends on is never fed
        if fed:
            assert _close(block[1], _independent(smollm, list(ids) + fed, layers))  # the last answer token fed
            checked_answers += 1
        else:
            assert np.array_equal(block[1], block[0])
    assert checked_answers >= 3


@pytest.mark.slow  # SmolLM2 on CPU
def test_multiple_choice_keeps_the_option_pass_state(smollm) -> None:
    from cic.data import build_prompt, load_questions
    from cic.llm.generation import generate_for_questions

    questions = load_questions("commonsense_qa", limit=3, seed=0)
    prompts = [build_prompt(r, tokenizer=smollm.tokenizer) for r in questions.iter_rows(named=True)]
    gen = AnswerGenerator(smollm, GenerationConfig(n_samples=2, keep_hidden=(-1,)))
    rows = generate_for_questions(gen, questions, prompts, run_key="k")
    greedy = rows.filter(rows["sample_index"] == 0)
    assert rows.filter(rows["sample_index"] > 0)["hidden"].is_null().all()
    encoded, _ = gen._encode(prompts)
    for qi, ids in enumerate(encoded):
        block = unpack(greedy["hidden"][qi], 1).astype(np.float32)
        assert np.array_equal(block[0], block[1]) and _close(block[0], _independent(smollm, list(ids), gen.kept_layers))
