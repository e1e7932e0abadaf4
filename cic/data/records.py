"""Turn one source record (a hub row, a JSONL line) into the canonical question fields.

A parser takes one record in its source's column layout and returns the fields of a QUESTIONS row except
`dataset` and `split`: question_id, question, choices, choice_labels, answer, aliases. A missing or
malformed field raises `RecordError` naming the field; the loader adds which row of which source it was.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cic.errors import UserError

Row = dict[str, Any]
RecordParser = Callable[[Mapping[str, Any]], Row]


class RecordError(UserError):
    """A source record lacks a required field or holds a malformed value (`field` names it)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r} {problem}")
        self.field = field


def get_field(record: Mapping[str, Any], path: str, *, required: bool = True) -> Any:
    """The value at a dotted path (`answer.value`); a required field that is absent, null or "" is an error."""
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            value = None
            break
        value = value[part]
    if required and (value is None or (isinstance(value, str) and not value.strip())):
        raise RecordError(path, "is missing or empty")
    return value


def _text(record: Mapping[str, Any], path: str) -> str:
    value = get_field(record, path)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecordError(path, f"must be text; got {type(value).__name__} {value!r}")
    return str(value).strip()


def _text_list(record: Mapping[str, Any], path: str, *, required: bool) -> list[str]:
    value = get_field(record, path, required=required)
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise RecordError(path, f"must be a list of strings; got {type(value).__name__} {value!r}")
    items = [str(v).strip() for v in value if v is not None]
    if required and not items:
        raise RecordError(path, "is an empty list")
    return items


def _unique_aliases(aliases: Sequence[str], answer: str) -> list[str]:
    """Aliases without blanks, repeats or the answer itself, in source order."""
    seen = {answer}
    out = []
    for alias in aliases:
        if alias and alias not in seen:
            seen.add(alias)
            out.append(alias)
    return out


def _choices_row(question_id: str, question: str, texts: list[str], labels: list[str], answer: str,
                 labels_field: str, answer_field: str) -> Row:
    if len(texts) < 2:
        raise RecordError(labels_field, f"needs at least two options; got {len(texts)}")
    if len(labels) != len(texts):
        raise RecordError(labels_field, f"has {len(labels)} labels for {len(texts)} options")
    if len(set(labels)) != len(labels):
        raise RecordError(labels_field, f"repeats a label: {labels}")
    if answer not in labels:
        raise RecordError(answer_field, f"= {answer!r} is not one of the option labels {', '.join(labels)}")
    return {"question_id": question_id, "question": question, "choices": texts, "choice_labels": labels,
            "answer": answer, "aliases": []}


def commonsense_qa_record(record: Mapping[str, Any]) -> Row:
    """The hub layout of `tau/commonsense_qa`: id, question, choices{label, text}, answerKey."""
    return _choices_row(_text(record, "id"), _text(record, "question"),
                        _text_list(record, "choices.text", required=True),
                        _text_list(record, "choices.label", required=True), _text(record, "answerKey"),
                        "choices.label", "answerKey")


def trivia_qa_record(record: Mapping[str, Any]) -> Row:
    """TriviaQA: the hub record (`answer` = {value, aliases, ...}) or a flat one (`answer` = the value)."""
    answer_field = get_field(record, "answer")
    if isinstance(answer_field, Mapping):
        answer = _text(record, "answer.value")
        aliases = _text_list(record, "answer.aliases", required=False)
    else:
        answer, aliases = _text(record, "answer"), []
    return {"question_id": _text(record, "question_id"), "question": _text(record, "question"), "choices": None,
            "choice_labels": None, "answer": answer, "aliases": _unique_aliases(aliases, answer)}


def open_ended_fields(*, question_id: str = "question_id", question: str = "question", answer: str = "answer",
                      aliases: str | None = None) -> RecordParser:
    """A parser for a user's open-ended records: name the source field holding each canonical one."""

    def parse(record: Mapping[str, Any]) -> Row:
        value = _text(record, answer)
        extra = _text_list(record, aliases, required=False) if aliases else []
        return {"question_id": _text(record, question_id), "question": _text(record, question), "choices": None,
                "choice_labels": None, "answer": value, "aliases": _unique_aliases(extra, value)}

    return parse


def multiple_choice_fields(*, question_id: str = "question_id", question: str = "question",
                           choices: str = "choices", answer: str = "answer",
                           choice_labels: str | None = None) -> RecordParser:
    """A parser for a user's multiple-choice records; labels default to A, B, C, ... when not given."""

    def parse(record: Mapping[str, Any]) -> Row:
        texts = _text_list(record, choices, required=True)
        if choice_labels:
            labels = _text_list(record, choice_labels, required=True)
        else:
            labels = list(string.ascii_uppercase[:len(texts)])
        return _choices_row(_text(record, question_id), _text(record, question), texts, labels,
                            _text(record, answer), choice_labels or choices, answer)

    return parse
