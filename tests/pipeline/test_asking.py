"""`cic ask`'s pieces that need no model: how an answer is shown, which gates it refuses before loading one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cic.errors import UserError


def test_a_multiple_choice_answer_is_shown_as_its_letter_and_its_option() -> None:
    from cic.pipeline.gates.asking import shown_answer

    options = ["London", "Paris", "Rome"]
    assert shown_answer("B", options) == "B (Paris)" and shown_answer(" C", options) == "C (Rome)"
    assert shown_answer("D", options) == "D"  # not an option: as it is
    assert shown_answer("Paris", None) == "Paris" and shown_answer("B", None) == "B"  # open questions: as they are


def test_a_production_streams_gate_is_refused_by_ask_and_pointed_at_the_export(tmp_path: Path) -> None:
    """A stream no registry entry describes: `cic ask` would not know its prompt, so it refuses (before any model
    loads: `ask_question` checks it before its loading line) and names the export that serves it, for this store."""
    from cic.pipeline.gates.asking import askable_dataset

    askable_dataset("trivia_qa", "a" * 16, "cic.duckdb")  # a registered dataset: asked as generated
    db = str(tmp_path / "prod.duckdb")
    with pytest.raises(UserError, match="production stream") as refused:
        askable_dataset("web", "a" * 16, db)
    assert f"`cic gate export --db {db} --out live-gates.json`" in str(refused.value)
