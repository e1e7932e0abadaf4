"""What a run's generating cost, read back from the store: generations a question (free text: one per row; multiple
choice: one forward pass a question) and the rows in drawn order, against `generations_drawn`."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from cic import schema
from cic.llm.answering import generations_drawn
from cic.store.database import Store
from cic.store.queries import generations_by_question, generations_in_order, generations_per_question, greedy_errors


def rows(run_key: str, drawn: dict[str, int], option: bool = False) -> pl.DataFrame:
    out = [{"run_key": run_key, "question_id": q, "sample_index": s, "text": f"{q}/{s}", "n_tokens": 2,
            "logprob_sum": -1.0, "logprob_mean": -0.5, "is_greedy": s == 0,
            "option_probs": [0.5, 0.5] if option else None, "flags": []}
           for q, count in drawn.items() for s in reversed(range(count))]  # stored out of order on purpose
    return pl.DataFrame(out, schema=schema.GENERATIONS.schema)


def test_generations_a_question_counts_rows_of_free_text_and_one_pass_a_choice(tmp_path: Path) -> None:
    adaptive = rows("r", {"a": 3, "b": 11, "c": 5})
    choices = rows("m", {"x": 11, "y": 11}, option=True)
    with Store.open(tmp_path / "c.duckdb") as store:
        store.upsert_batches("generations", [adaptive, choices])
        assert generations_per_question(store, "r") == (3 + 11 + 5) / 3 == generations_drawn(adaptive) / 3
        assert generations_per_question(store, "m") == 1.0 == generations_drawn(choices) / 2
        assert generations_per_question(store, "none") is None
        each = {r: dict(generations_by_question(store, r).iter_rows()) for r in ("r", "m")}
        ordered = generations_in_order(store).filter(run_key="r")
        store.upsert_batches("labels", [pl.DataFrame({"run_key": "r", "question_id": ["a", "b"], "criterion": "c",
                                                      "aligned": [True, False], "value": [1.0, 0.0]})])
        wrong = dict(greedy_errors(store, "c").drop("run_key").iter_rows())
    assert ordered.height == 19 and set(ordered.get_column("run_key")) == {"r"}
    for _, own in ordered.group_by("question_id", maintain_order=True):
        assert own.get_column("sample_index").to_list() == list(range(own.height))
    assert wrong == {"a": False, "b": True}
    assert each == {"r": {"a": 3, "b": 11, "c": 5}, "m": {"x": 1, "y": 1}}  # per question, what the mean averages
