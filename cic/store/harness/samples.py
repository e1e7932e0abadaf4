"""Scores of what a harness recorded: CIC's sample-based estimators on each question's K generations, with the
pipeline's default meaning classes (MiniLM embeddings) — harnesses keep no token log-probabilities of their samples,
so the estimators that need them are left out —, and CIC's option estimators on a multiple-choice question's option
log-likelihoods."""

from __future__ import annotations

from collections.abc import Sequence

SAMPLE_ESTIMATORS = ("semantic_entropy", "num_semantic_sets", "lexical_similarity", "eigv", "deg", "ecc")
OPTION_ESTIMATORS = ("one_minus_max_prob", "option_entropy")


def option_scores(question_id: str, loglikelihoods: Sequence[float]) -> dict[str, float | None]:
    """CIC's option estimators on one question: the options' probabilities are the softmax of their
    log-likelihoods."""
    import numpy as np

    from cic.llm.uncertainty.estimators import ESTIMATORS
    from cic.llm.uncertainty.statistics import QuestionStats

    ll = np.asarray(loglikelihoods, dtype=float)
    probs = np.exp(ll - ll.max())
    probs /= probs.sum()
    stats = QuestionStats(question_id, [], np.zeros(0), np.zeros(0), probs, None)
    return {name: ESTIMATORS.lookup(name).compute(stats) for name in OPTION_ESTIMATORS}


def sample_scores(samples: dict[str, list[str]], estimators: Sequence[str] = SAMPLE_ESTIMATORS
                  ) -> dict[str, dict[str, float | None]]:
    """Per document, CIC's sample estimators on its samples (the pipeline's default MiniLM equivalence)."""
    import polars as pl

    from cic.llm.embeddings import SentenceEmbedder
    from cic.llm.uncertainty.equivalence import make_equivalence
    from cic.llm.uncertainty.scorer import UncertaintyScorer

    generations = pl.DataFrame(
        [{"question_id": doc, "sample_index": i, "text": text, "logprob_sum": None, "logprob_mean": None,
          "option_probs": None} for doc, texts in samples.items() for i, text in enumerate(texts, 1)],
        schema={"question_id": pl.String, "sample_index": pl.Int64, "text": pl.String, "logprob_sum": pl.Float64,
                "logprob_mean": pl.Float64, "option_probs": pl.List(pl.Float64)})
    scorer = UncertaintyScorer(make_equivalence("embedding", embedder=SentenceEmbedder()), estimators)
    scored = scorer.score(generations, run_key="harness")
    out: dict[str, dict[str, float | None]] = {doc: {} for doc in samples}
    for row in scored.iter_rows(named=True):
        out[row["question_id"]][row["estimator"]] = row["value"]
    return out
