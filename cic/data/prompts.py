"""Prompt builders: the exact text fed to the model for one question row, versioned by a prompt id.

Contract for generation (`build_prompt(row, tokenizer=..., prompt_id=...)` or `builder.build(row, tokenizer)`):

- `row` is a QUESTIONS row as a dict (question, choices, choice_labels, ...; `dataset` picks the default
  builder). The return value is the complete prompt string; feed it as is (do not add special tokens again
  when the chat template already wrote them).
- With a tokenizer that has a chat template: few-shot turns (user question, assistant answer) followed by the
  question, rendered by `tokenizer.apply_chat_template(..., add_generation_prompt=True, tokenize=False)`, so
  the text ends where the assistant's answer begins. Without a tokenizer or chat template: a few-shot plain
  prompt that ends with "Answer:" (the model's next token carries a leading space, e.g. " B").
- Multiple choice (`mc-letter-v1`): asks for exactly one option letter; the model's NEXT token is the letter.
  Read option probabilities from the next-token distribution over `row["choice_labels"]` (with and without
  the leading space in plain mode).
- Short answer (`short-answer-v1`): asks for a short answer on one line; stop generating at the first newline.
- `prompt_id` goes into `schema.run_key`: any change to a builder's text must come with a new id
  (tests pin the rendered text of every built-in builder).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cic.errors import UserError
from cic.registry import Registry

PromptKind = Literal["multiple_choice", "short_answer"]


@dataclass(frozen=True)
class PromptBuilder:
    """One versioned prompt: an instruction, worked examples (question rows with answers) and a kind."""

    prompt_id: str
    kind: PromptKind
    instruction: str
    examples: tuple[Mapping[str, Any], ...]
    answer_cue: str = "Answer:"

    def question_block(self, row: Mapping[str, Any]) -> str:
        """The question as shown to the model (with its lettered options for multiple choice)."""
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise UserError(f"question_id {row.get('question_id')!r}: field 'question' is missing or empty; "
                             f"prompt {self.prompt_id!r} needs it")
        if self.kind == "short_answer":
            return f"Question: {question.strip()}"
        choices, labels = row.get("choices"), row.get("choice_labels")
        if not choices or not labels or len(choices) != len(labels):
            raise UserError(f"question_id {row.get('question_id')!r}: prompt {self.prompt_id!r} needs "
                             f"'choices' and 'choice_labels' of equal length; got {choices!r} and {labels!r}")
        options = "\n".join(f"{label}. {text}" for label, text in zip(labels, choices, strict=True))
        return f"Question: {question.strip()}\n{options}"

    def instruction_for(self, row: Mapping[str, Any]) -> str:
        labels = row.get("choice_labels") or []
        return self.instruction.format(labels=", ".join(labels[:-1]) + f" or {labels[-1]}" if labels else "")

    def build(self, row: Mapping[str, Any], tokenizer: Any = None) -> str:
        """The full prompt for `row`: chat template when the tokenizer has one, few-shot plain text otherwise."""
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(self.messages(row), add_generation_prompt=True, tokenize=False)
            if not isinstance(text, str):
                raise UserError(f"tokenizer.apply_chat_template returned {type(text).__name__}, expected str")
            return text
        instruction = self.instruction_for(row)
        shots = [(self.question_block(ex), str(ex["answer"])) for ex in self.examples]
        parts = [instruction] + [f"{q}\n{self.answer_cue} {a}" for q, a in shots]
        return "\n\n".join(parts + [f"{self.question_block(row)}\n{self.answer_cue}"])

    def messages(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        """The prompt as chat messages (the few-shot examples as earlier turns, the instruction in the first): what
        a chat template renders, and what a served model's chat API takes."""
        messages: list[dict[str, str]] = []
        for example in self.examples:
            messages += [{"role": "user", "content": self.question_block(example)},
                         {"role": "assistant", "content": str(example["answer"])}]
        messages.append({"role": "user", "content": self.question_block(row)})
        messages[0] = {"role": "user", "content": f"{self.instruction_for(row)}\n\n{messages[0]['content']}"}
        return messages


def _mc_example(question: str, options: Sequence[str], answer: str) -> dict[str, Any]:
    return {"question": question, "choices": list(options), "choice_labels": list("ABCDE"), "answer": answer}


MC_LETTER_V1 = PromptBuilder(
    prompt_id="mc-letter-v1",
    kind="multiple_choice",
    instruction="Answer each multiple-choice question with the letter of the one correct option "
                "({labels}) and nothing else.",
    examples=(
        _mc_example("Where would you keep a carton of milk so that it stays cold?",
                    ["cupboard", "refrigerator", "oven", "mailbox", "bookshelf"], "B"),
        _mc_example("What might a person use to cut a sheet of paper in two?",
                    ["spoon", "pillow", "sponge", "blanket", "scissors"], "E"),
        _mc_example("What do people usually do when they feel very tired at night?",
                    ["go to sleep", "run a marathon", "paint the house", "buy a car", "climb a tree"], "A"),
    ),
)

SHORT_ANSWER_V1 = PromptBuilder(
    prompt_id="short-answer-v1",
    kind="short_answer",
    instruction="Answer each question with a short answer of a few words, on one line, and nothing else.",
    examples=(
        {"question": "Which planet is known as the Red Planet?", "answer": "Mars"},
        {"question": "Who wrote the novel Pride and Prejudice?", "answer": "Jane Austen"},
        {"question": "What is the chemical symbol for gold?", "answer": "Au"},
    ),
)

PROMPTS: Registry[PromptBuilder] = Registry("prompt_id", (MC_LETTER_V1, SHORT_ANSWER_V1), name_of=lambda p: p.prompt_id)


def get_prompt(prompt_id: str) -> PromptBuilder:
    """The built-in prompt builder with this id."""
    return PROMPTS.lookup(prompt_id)
