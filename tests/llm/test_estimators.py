"""Every estimator against a value computed by hand, on hand-made generation rows."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from cic import schema
from cic.errors import UserError
from cic.llm.uncertainty import ExactEquivalence, UncertaintyScorer, list_estimators, stored_name
from cic.llm.uncertainty.estimators import (
    deg,
    ecc,
    eigv,
    lexical_similarity,
    num_semantic_sets,
    option_entropy,
    predictive_entropy,
    predictive_entropy_normalized,
    semantic_entropy,
    semantic_entropy_weighted,
)
from cic.llm.uncertainty.statistics import QuestionStats


def stats(texts: list[str], logprob_sum: list[float], n_tokens: list[int], option_probs=None) -> QuestionStats:
    s = np.array(logprob_sum)
    return QuestionStats("q", texts, s, s / np.array(n_tokens), option_probs, ExactEquivalence())


SAMPLE = stats(["Paris", "paris.", "Lyon", "Paris"], [-1.0, -2.0, -3.0, -1.0], [1, 2, 3, 1])


def test_semantic_entropy_from_cluster_frequencies() -> None:
    # clusters {Paris, paris., Paris} and {Lyon}: p = (3/4, 1/4)
    assert semantic_entropy(SAMPLE) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert num_semantic_sets(SAMPLE) == 2


def test_weighted_semantic_entropy_uses_length_normalised_likelihoods() -> None:
    w = np.exp([-1.0, -1.0, -1.0, -1.0])  # per-token means are all -1
    p = np.array([w[0] + w[1] + w[3], w[2]]) / w.sum()
    assert semantic_entropy_weighted(SAMPLE) == pytest.approx(-(p * np.log(p)).sum())


def test_weighted_semantic_entropy_weighs_each_sample_by_its_per_token_mean() -> None:
    # per-token means -0.5, -3, -1: Paris carries exp(-0.5) + exp(-1), Lyon exp(-3) — not the counts 2 : 1
    s = stats(["Paris", "Lyon", "Paris"], [-0.5, -3.0, -2.0], [1, 1, 2])
    paris, lyon = math.exp(-0.5) + math.exp(-1.0), math.exp(-3.0)
    p = np.array([paris, lyon]) / (paris + lyon)
    assert semantic_entropy_weighted(s) == pytest.approx(-(p * np.log(p)).sum())
    assert semantic_entropy_weighted(s) < semantic_entropy(s) - 0.2  # the likely cluster dominates
    # weights from per-token means, not sums: with sums Paris would weigh exp(-0.5) + exp(-2)
    by_sum = np.array([math.exp(-0.5) + math.exp(-2.0), lyon]) / (math.exp(-0.5) + math.exp(-2.0) + lyon)
    assert semantic_entropy_weighted(s) != pytest.approx(-(by_sum * np.log(by_sum)).sum())


def test_predictive_entropies() -> None:
    assert predictive_entropy(SAMPLE) == pytest.approx(7 / 4)
    assert predictive_entropy_normalized(SAMPLE) == pytest.approx(1.0)


def test_lexical_similarity_is_negated_mean_pairwise_rouge_l() -> None:
    s = stats(["the cat sat", "cat sat down", "dog"], [-1, -1, -1], [1, 1, 1])
    # normalised tokens: [cat, sat], [cat, sat, down], [dog]; LCS F1: 2*1*(2/3)/(1+2/3) = 0.8, 0, 0
    assert lexical_similarity(s) == pytest.approx(-0.8 / 3)
    assert lexical_similarity(stats(["A", "B"], [-1, -1], [1, 1], option_probs=np.array([0.5, 0.5]))) is None


def test_graph_estimators_on_two_clean_clusters() -> None:
    # W = block diagonal of ones (sizes 3 and 1): L has eigenvalues 0, 0, 1.5, 1.5
    assert eigv(SAMPLE) == pytest.approx(2.0)
    assert deg(SAMPLE) == pytest.approx(1 - (9 + 1) / 16)
    # eigenvectors of the two zero eigenvalues: indicator directions of the clusters, rows (1/√3,0)x3 and (0,1)
    rows = np.array([[1 / math.sqrt(3), 0]] * 3 + [[0, 1]])
    assert ecc(SAMPLE) == pytest.approx(np.linalg.norm(rows - rows.mean(axis=0)))
    one = stats(["a", "a", "a"], [-1, -1, -1], [1, 1, 1])
    assert eigv(one) == pytest.approx(1.0) and deg(one) == pytest.approx(0.0) and ecc(one) == pytest.approx(0.0)


def test_option_estimators() -> None:
    s = stats(["A", "B"], [-1, -1], [1, 1], option_probs=np.array([0.5, 0.25, 0.25]))
    assert option_entropy(s) == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)))
    assert option_entropy(SAMPLE) is None


def generation_rows(question_id: str, texts: list[str], option_probs=None) -> pl.DataFrame:
    n = len(texts)
    return schema.conform(pl.DataFrame({
        "run_key": "r", "question_id": question_id, "sample_index": list(range(n)), "text": texts,
        "n_tokens": [1] * n, "logprob_sum": [-1.0] * n, "logprob_mean": [-1.0] * n,
        "is_greedy": [i == 0 for i in range(n)], "option_probs": [option_probs] * n, "flags": [[]] * n,
        "hidden": None},
        schema=schema.GENERATIONS.schema), schema.GENERATIONS)


def test_scorer_writes_one_row_per_question_and_estimator_with_nulls_where_undefined() -> None:
    gens = pl.concat([generation_rows("open", ["Paris", "Paris", "Lyon", ""]),
                      generation_rows("mc", ["B", "A", "B", "B"], [0.2, 0.7, 0.1])])
    scorer = UncertaintyScorer(ExactEquivalence(), list_estimators())
    scores = scorer.score(gens, run_key="r")
    assert scores.height == 2 * len(list_estimators())
    assert set(scores.get_column("estimator")) == set(scorer.stored_names())
    assert stored_name("semantic_entropy", "exact") == "semantic_entropy[exact]"
    by = {(r["question_id"], r["estimator"]): r["value"] for r in scores.iter_rows(named=True)}
    assert by[("open", "option_entropy")] is None and by[("mc", "lexical_similarity")] is None
    # samples are sample_index >= 1: open = {Paris, Lyon, ""} -> three singletons
    assert by[("open", "semantic_entropy[exact]")] == pytest.approx(math.log(3))
    # mc samples A, B, B
    assert by[("mc", "num_semantic_sets[exact]")] == 2
    assert by[("mc", "one_minus_max_prob")] == pytest.approx(0.3)


def test_unknown_estimator_is_refused_with_the_known_names() -> None:
    with pytest.raises(UserError, match="estimator = 'entropy': unknown; choose one of semantic_entropy"):
        UncertaintyScorer(ExactEquivalence(), ["entropy"])


def test_answers_without_log_probabilities_get_null_where_an_estimator_reads_them() -> None:
    """A served model that returns no token log-probabilities: the estimators that read them store null (not the
    value of log-probability 0, i.e. certainty); the sampling-only estimators are unchanged."""
    with_lp = generation_rows("q", ["Paris", "Paris", "Lyon", "Paris"])
    without = with_lp.with_columns(pl.lit(None, dtype=pl.Float64).alias("logprob_sum"),
                                   pl.lit(None, dtype=pl.Float64).alias("logprob_mean"))
    scorer = UncertaintyScorer(ExactEquivalence(), list_estimators())
    full = {r["estimator"]: r["value"] for r in scorer.score(with_lp, run_key="r").iter_rows(named=True)}
    bare = {r["estimator"]: r["value"] for r in scorer.score(without, run_key="r").iter_rows(named=True)}
    needs = {"semantic_entropy_weighted[exact]", "predictive_entropy", "predictive_entropy_normalized", "answer_nll",
             "answer_nll_mean", "one_minus_answer_prob"}
    assert all(full[name] is not None for name in needs) and all(bare[name] is None for name in needs)
    assert {k: v for k, v in bare.items() if k not in needs} == {k: v for k, v in full.items() if k not in needs}
    assert bare["semantic_entropy[exact]"] == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))


def test_estimators_declare_what_they_read_and_an_engine_lacking_it_skips_them_by_name() -> None:
    from cic.llm.engines import Capabilities
    from cic.llm.uncertainty.estimators import ESTIMATORS, NEEDS, Estimator, unmet_by

    assert all(e.needs <= set(NEEDS) for e in ESTIMATORS.values())
    assert {n for n, e in ESTIMATORS.items() if "token_logprobs" in e.needs} == {
        "semantic_entropy_weighted", "predictive_entropy", "predictive_entropy_normalized"}
    assert {n for n, e in ESTIMATORS.items() if e.uses_equivalence} == {
        "semantic_entropy", "semantic_entropy_weighted", "num_semantic_sets", "eigv", "deg", "ecc"}
    served = Capabilities(token_logprobs=False, option_probs=False, seeds=True, server_samples=False,
                          local_weights=False)
    names = ["semantic_entropy", "predictive_entropy", "option_entropy", "lexical_similarity"]
    assert unmet_by(names, set(served.offers())) == ["predictive_entropy", "option_entropy"]
    assert unmet_by(names, {"token_logprobs", "option_probs"}) == []
    with pytest.raises(ValueError, match="unknown need"):  # a programming error in an estimator module
        Estimator("x", lambda s: 0.0, frozenset({"gpu"}))


def test_the_one_pass_scores_read_the_most_likely_answer_alone() -> None:
    """answer_nll, answer_nll_mean and one_minus_answer_prob: the greedy answer's own log-probabilities (sample
    index 0), computed by hand; the samples never change them (so a run needs none for them); an engine without
    token log-probabilities skips them by name."""
    from cic.llm.uncertainty.estimators import ESTIMATORS, unmet_by

    first = pl.col("sample_index") == 0
    rows = generation_rows("q", ["Paris", "Paris", "Lyon", "Paris"]).with_columns(
        logprob_sum=pl.when(first).then(-0.4).otherwise("logprob_sum"),
        logprob_mean=pl.when(first).then(-0.2).otherwise("logprob_mean"))
    greedy = rows.filter(sample_index=0).row(0, named=True)
    assert greedy["logprob_sum"] == -0.4
    scorer = UncertaintyScorer(ExactEquivalence(), ["answer_nll", "answer_nll_mean", "one_minus_answer_prob"])
    got = {r["estimator"]: r["value"] for r in scorer.score(rows, run_key="r").iter_rows(named=True)}
    assert got == pytest.approx({"answer_nll": -greedy["logprob_sum"], "answer_nll_mean": -greedy["logprob_mean"],
                                 "one_minus_answer_prob": 1 - math.exp(greedy["logprob_sum"])})
    others = rows.with_columns(text=pl.when(pl.col("sample_index") > 0).then(pl.lit("Rome")).otherwise("text"),
                               logprob_sum=pl.when(pl.col("sample_index") > 0).then(-9.0).otherwise("logprob_sum"))
    alone = rows.filter(sample_index=0)
    for changed in (others, alone):
        assert {r["estimator"]: r["value"] for r in scorer.score(changed, run_key="r").iter_rows(named=True)} == got
    assert {n for n, e in ESTIMATORS.items() if e.one_pass} == {"answer_nll", "answer_nll_mean",
                                                                "one_minus_answer_prob", "option_entropy",
                                                                "one_minus_max_prob"}
    assert unmet_by(["answer_nll", "semantic_entropy"], {"option_probs"}) == ["answer_nll"]
