"""Statistic calculators (`cic.llm.uncertainty.calculators`): ordered by what they depend on, each computed once a
question and only where read; a new statistic is one `Calculator` and an estimator that names it, with no edit of
the shared statistics class."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from cic.errors import UserError
from cic.llm.uncertainty import calculators
from cic.llm.uncertainty.calculators import CALCULATORS, Calculator, calculation_order, closure
from cic.llm.uncertainty.equivalence import ExactEquivalence
from cic.llm.uncertainty.estimators import ESTIMATORS, Estimator
from cic.llm.uncertainty.statistics import QuestionStats


def stats_of(texts: list[str]) -> QuestionStats:
    k = len(texts)
    return QuestionStats("q1", texts, np.full(k, -1.0), np.full(k, -0.5), None, ExactEquivalence())


def test_statistics_are_ordered_after_what_they_depend_on_and_a_cycle_or_an_unknown_is_refused() -> None:
    assert calculation_order(["laplacian_eigen"]) == ["clusters", "similarity", "laplacian_eigen"]
    assert calculation_order(["similarity", "clusters"]) == ["clusters", "similarity"]
    assert closure({"laplacian_eigen", "token_logprobs"}) == {"clusters", "similarity", "laplacian_eigen",
                                                              "token_logprobs"}
    with pytest.raises(UserError, match="statistic = 'nope': unknown"):
        calculation_order(["nope"])
    CALCULATORS.register(Calculator("a_stat", lambda s: 0, ("b_stat",)))
    CALCULATORS.register(Calculator("b_stat", lambda s: 0, ("a_stat",)))
    try:
        with pytest.raises(UserError, match=r"statistic 'a_stat': depends on itself \(a_stat -> b_stat -> a_stat\)"):
            calculation_order(["a_stat"])
    finally:
        CALCULATORS.unregister("a_stat")
        CALCULATORS.unregister("b_stat")


def test_each_statistic_is_computed_once_a_question_and_the_graph_statistics_match_their_definitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for name in ("clusters", "similarity", "laplacian_eigen"):
        real = CALCULATORS[name]
        monkeypatch.setitem(CALCULATORS._entries, name, Calculator(
            name, lambda s, real=real, name=name: (calls.append(name), real.compute(s))[1], real.depends_on))
    stats = stats_of(["paris", "paris", "lyon", "paris"])
    for estimator in ("eigv", "deg", "ecc", "semantic_entropy", "num_semantic_sets"):
        ESTIMATORS[estimator].compute(stats)
    assert sorted(calls) == ["clusters", "laplacian_eigen", "similarity"]  # once each, for five estimators
    assert stats.clusters.tolist() == [0, 0, 1, 0]
    w = (stats.clusters[:, None] == stats.clusters[None, :]).astype(float)
    assert np.array_equal(stats.similarity, w)
    lap = np.eye(4) - w / np.sqrt(np.outer(w.sum(1), w.sum(1)))
    assert np.allclose(stats.laplacian_eigen[0], np.linalg.eigvalsh(lap))


def test_a_new_statistic_is_a_calculator_and_an_estimator_that_names_it() -> None:
    """`mean_words` is registered as a calculator depending on nothing; an estimator needing it is scored by the
    scorer with the built-in ones, and the statistic is computed once a question."""
    from cic.llm.uncertainty.scorer import UncertaintyScorer

    computed: list[str] = []

    def mean_words(stats: QuestionStats) -> float:
        computed.append(stats.question_id)
        return float(np.mean([len(t.split()) for t in stats.texts]))

    CALCULATORS.register(Calculator("mean_words", mean_words, help="mean words of the samples"))
    ESTIMATORS.register(Estimator("wordiness", lambda s: s.stat("mean_words"), frozenset({"mean_words"})))
    try:
        with pytest.raises(ValueError, match="unknown need"):
            Estimator("bad", lambda s: 0.0, frozenset({"mean_letters"}))
        rows = pl.DataFrame({"question_id": ["a"] * 3 + ["b"] * 3, "sample_index": [0, 1, 2] * 2,
                             "text": ["x", "one two", "one two three four", "y", "a", "b c"],
                             "logprob_sum": [-1.0] * 6, "logprob_mean": [-0.5] * 6, "option_probs": [None] * 6},
                            schema_overrides={"option_probs": pl.List(pl.Float64)})
        scorer = UncertaintyScorer(ExactEquivalence(), ["wordiness", "num_semantic_sets"])
        scores = scorer.score(rows, run_key="r")
        got = dict(zip(scores.get_column("question_id") + "/" + scores.get_column("estimator"),
                       scores.get_column("value"), strict=True))
        assert got["a/wordiness"] == 3.0 and got["b/wordiness"] == 1.5 and computed == ["a", "b"]
    finally:
        ESTIMATORS.unregister("wordiness")
        CALCULATORS.unregister("mean_words")
    assert "mean_words" not in CALCULATORS.names() and calculators.CALCULATORS is CALCULATORS
