"""Uncertainty: semantic equivalence, clustering, shared per-question statistics and the estimators.

    from cic.llm.uncertainty import UncertaintyScorer, make_equivalence
    scorer = UncertaintyScorer(make_equivalence("exact"), ["semantic_entropy", "predictive_entropy"])
    scores = scorer.score(generations, run_key=key)          # SCORES rows

Imports numpy and polars only; models (embeddings, NLI) load on first use.
"""

from cic.llm.uncertainty.equivalence import (
    NLI_VARIANTS,
    EmbeddingEquivalence,
    ExactEquivalence,
    NliEquivalence,
    cluster_answers,
    cluster_many,
    entailment_decision,
    make_equivalence,
)
from cic.llm.uncertainty.estimators import ESTIMATORS, get_estimator, list_estimators, stored_name
from cic.llm.uncertainty.scorer import UncertaintyScorer
from cic.llm.uncertainty.statistics import QuestionStats

__all__ = [
    "ESTIMATORS",
    "NLI_VARIANTS",
    "EmbeddingEquivalence",
    "ExactEquivalence",
    "NliEquivalence",
    "QuestionStats",
    "UncertaintyScorer",
    "cluster_answers",
    "cluster_many",
    "entailment_decision",
    "get_estimator",
    "list_estimators",
    "make_equivalence",
    "stored_name",
]
