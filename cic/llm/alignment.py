"""Alignment criteria: is the most-likely answer correct? Each gives a value and a boolean.

- option_match: the arg-max option letter equals the gold letter (value 1/0).
- similarity[τ]: cosine similarity of sentence embeddings (MiniLM by default) between the answer and the gold
  answer or any alias (the max) ≥ τ; τ = 0.6 as in the paper.
- exact_match: SQuAD-normalised answer equals the gold answer or an alias (value 1/0).
- token_f1[τ]: SQuAD token F1 against the gold answer and aliases (the max) ≥ τ (default 0.5).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.llm.text import normalize_answer, token_f1
from cic.registry import Registry

# criterion -> its default threshold (None: it takes none)
CRITERIA: Registry[float | None] = Registry("criterion", {"option_match": None, "similarity": 0.6,
                                                           "exact_match": None, "token_f1": 0.5},
                                            hint="similarity and token_f1 take a threshold: similarity[0.6]")
_PATTERN = re.compile(r"^(?P<name>[a-z_0-9]+)(\[(?P<param>[^\]]*)\])?$")


@dataclass(frozen=True)
class Criterion:
    """A parsed criterion: base name and threshold (for similarity and token_f1)."""

    name: str
    threshold: float | None

    @property
    def label(self) -> str:
        return self.name if self.threshold is None else f"{self.name}[{self.threshold:g}]"


def parse_criterion(text: str) -> Criterion:
    """"similarity[0.6]" → Criterion("similarity", 0.6); errors name the value."""
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if not match or match["name"] not in CRITERIA:
        raise UserError(CRITERIA.unknown(text))
    name, param = match["name"], match["param"]
    if CRITERIA[name] is None:
        if param is not None:
            raise UserError(f"criterion = {text!r}: {name} takes no parameter")
        return Criterion(name, None)
    try:
        threshold = CRITERIA[name] if param is None else float(param)
    except ValueError:
        raise UserError(f"criterion = {text!r}: threshold {param!r} is not a number") from None
    if not 0 <= threshold <= 1:
        raise UserError(f"criterion = {text!r}: threshold must lie in [0, 1]")
    return Criterion(name, threshold)


def default_criteria(is_multiple_choice: bool) -> list[str]:
    """The paper's criterion: option match for multiple choice, similarity ≥ 0.6 otherwise."""
    return ["option_match"] if is_multiple_choice else ["similarity[0.6]"]


def _references(question: dict[str, Any]) -> list[str]:
    return [question["answer"], *(question.get("aliases") or [])]


def label_generations(questions: pl.DataFrame, generations: pl.DataFrame, criteria: Sequence[str], *,
                      run_key: str, embedder: Any = None) -> pl.DataFrame:
    """LABELS rows for the most-likely answer of each question; a criterion that does not apply gives no row."""
    parsed = [parse_criterion(c) for c in criteria]
    greedy = {r["question_id"]: r["text"] for r in generations.filter(pl.col("sample_index") == 0)
              .iter_rows(named=True)}
    records = []
    pending: list[tuple[str, str, list[str], Criterion]] = []
    for q in questions.iter_rows(named=True):
        answer = greedy.get(q["question_id"])
        if answer is None:
            continue
        is_mc = q.get("choices") is not None
        for c in parsed:
            if c.name == "option_match":
                if is_mc:
                    hit = answer.strip().upper() == str(q["answer"]).strip().upper()
                    records.append((q["question_id"], c.label, hit, float(hit)))
            elif is_mc:
                continue
            elif c.name == "exact_match":
                hit = normalize_answer(answer) in {normalize_answer(r) for r in _references(q)}
                records.append((q["question_id"], c.label, hit, float(hit)))
            elif c.name == "token_f1":
                value = max(token_f1(answer, r) for r in _references(q))
                records.append((q["question_id"], c.label, value >= c.threshold, value))
            else:
                pending.append((q["question_id"], answer, _references(q), c))
    if pending:
        if embedder is None:
            raise UserError("criterion 'similarity' needs a sentence embedder")
        texts = list(dict.fromkeys(t for _, a, refs, _ in pending for t in (a, *refs)))
        vectors = dict(zip(texts, embedder.encode(texts), strict=True))
        for question_id, answer, refs, c in pending:
            value = max(float(vectors[answer] @ vectors[r]) for r in refs) if answer.strip() else 0.0
            records.append((question_id, c.label, value >= c.threshold, value))
    frame = pl.DataFrame(records, schema={"question_id": pl.String, "criterion": pl.String, "aligned": pl.Boolean,
                                          "value": pl.Float64}, orient="row")
    return schema.conform(frame.with_columns(run_key=pl.lit(run_key), created_at=pl.lit(
        None, dtype=pl.Datetime("us", "UTC"))), schema.LABELS)
