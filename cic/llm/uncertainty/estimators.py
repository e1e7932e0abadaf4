"""Uncertainty estimators (higher = more uncertain), each a cheap function of a question's shared statistics.

K is the number of samples; p_c the share of samples in meaning class c; ℓ_i the log-probability of sample i
(sum over its tokens) and ℓ̄_i its per-token mean; W the [K, K] similarity matrix, D its degree matrix and
L = I − D^{-1/2} W D^{-1/2} the normalised graph Laplacian with eigenvalues λ_k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cic.llm.text import rouge_l
from cic.llm.uncertainty.calculators import CALCULATORS, closure
from cic.llm.uncertainty.statistics import QuestionStats
from cic.registry import Registry


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def semantic_entropy(s: QuestionStats) -> float:
    """Discrete semantic entropy: SE = −Σ_c p_c log p_c, p_c = |{i : i ∈ c}| / K (Farquhar et al., 2024)."""
    counts = np.bincount(s.clusters)
    return _entropy(counts / counts.sum())


def semantic_entropy_weighted(s: QuestionStats) -> float:
    """Likelihood-weighted semantic entropy: p_c = Σ_{i∈c} exp(ℓ̄_i) / Σ_i exp(ℓ̄_i), SE = −Σ_c p_c log p_c
    (length-normalised sequence likelihoods, Kuhn et al., 2023)."""
    w = np.exp(s.logprob_mean - np.max(s.logprob_mean))
    mass = np.bincount(s.clusters, weights=w)
    return _entropy(mass / mass.sum())


def num_semantic_sets(s: QuestionStats) -> float:
    """Number of meaning classes among the K samples (Lin et al., 2023)."""
    return float(len(np.unique(s.clusters)))


def predictive_entropy(s: QuestionStats) -> float:
    """Monte-Carlo predictive entropy: PE = −(1/K) Σ_i ℓ_i."""
    return float(-np.mean(s.logprob_sum))


def predictive_entropy_normalized(s: QuestionStats) -> float:
    """Length-normalised predictive entropy: −(1/K) Σ_i ℓ̄_i (Malinin & Gales, 2021)."""
    return float(-np.mean(s.logprob_mean))


def lexical_similarity(s: QuestionStats) -> float | None:
    """Negated mean pairwise ROUGE-L among the samples: −(2 / K(K−1)) Σ_{i<j} ROUGE-L(a_i, a_j).
    Not defined for option letters (null)."""
    if s.is_multiple_choice or len(s.texts) < 2:
        return None
    pairs = [rouge_l(a, b) for i, a in enumerate(s.texts) for b in s.texts[i + 1:]]
    return -float(np.mean(pairs))


def eigv(s: QuestionStats) -> float:
    """EigV = Σ_k max(0, 1 − λ_k) (Lin et al., 2023): about the number of clusters in the similarity graph."""
    values, _ = s.laplacian_eigen
    return float(np.clip(1.0 - values, 0.0, None).sum())


def deg(s: QuestionStats) -> float:
    """Deg = 1 − Σ_ij W_ij / K² (= trace(K·I − D) / K², Lin et al., 2023)."""
    w = s.similarity
    return float(1.0 - w.sum() / len(w) ** 2)


def ecc(s: QuestionStats) -> float:
    """Ecc = ‖[v'_1, …, v'_K]‖₂ (Lin et al., 2023): v_j are the rows of the eigenvectors of L whose eigenvalues
    are < 1 (at least the smallest), v'_j = v_j − mean_j v_j; the spread of the samples in spectral space."""
    values, vectors = s.laplacian_eigen
    k = max(1, int((values < 1.0 - 1e-9).sum()))
    embedded = vectors[:, :k]
    centred = embedded - embedded.mean(axis=0, keepdims=True)
    return float(np.linalg.norm(centred))


def option_entropy(s: QuestionStats) -> float | None:
    """Entropy of the option distribution: −Σ_o p_o log p_o (multiple choice only)."""
    return None if s.option_probs is None else _entropy(np.asarray(s.option_probs, dtype=np.float64))


def one_minus_max_prob(s: QuestionStats) -> float | None:
    """1 − max_o p_o over the options (multiple choice only)."""
    return None if s.option_probs is None else float(1.0 - np.max(s.option_probs))


def answer_nll(s: QuestionStats) -> float | None:
    """One pass: −ℓ_0, the most likely answer's own negative log-probability (no sample needed)."""
    return None if s.greedy_logprob_sum is None else float(-s.greedy_logprob_sum)


def answer_nll_mean(s: QuestionStats) -> float | None:
    """One pass: −ℓ̄_0, the most likely answer's mean negative token log-probability (no sample needed)."""
    return None if s.greedy_logprob_mean is None else float(-s.greedy_logprob_mean)


def one_minus_answer_prob(s: QuestionStats) -> float | None:
    """One pass: 1 − exp(ℓ_0), one minus the most likely answer's probability (no sample needed)."""
    return None if s.greedy_logprob_sum is None else float(1.0 - math.exp(s.greedy_logprob_sum))


NEEDS = {  # what an estimator may read, beyond the sampled texts every one gets (and any registered statistic:
    # `cic.llm.uncertainty.calculators.CALCULATORS`)
    "clusters": "meaning classes of the samples (the equivalence: its name enters the stored estimator name)",
    "similarity": "pairwise similarity of the samples (the equivalence's, or its embeddings')",
    "token_logprobs": "token log-probabilities of every sample (null for answers that came without them)",
    "option_probs": "option probabilities (multiple choice; a served model gives them only with top_logprobs)",
    "answer_logprobs": "token log-probabilities of the most likely answer alone (one pass: no sample read)",
}
DATA_NEEDS = ("token_logprobs", "option_probs")  # needs an engine may lack (`cic.llm.engines.Capabilities`)
ONE_PASS = frozenset({"answer_logprobs", "option_probs"})  # an estimator needing only these reads no sample


@dataclass(frozen=True)
class Estimator:
    """A named estimator and the statistics it reads (`NEEDS`): the scorer computes only what some requested
    estimator needs, each statistic once per question, and stores null where an answer lacks a data need (never
    a 0 read from a missing log-probability)."""

    name: str
    compute: Callable[[QuestionStats], float | None]
    needs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if unknown := sorted(n for n in self.needs if n not in NEEDS and CALCULATORS.find(n) is None):
            raise ValueError(f"estimator {self.name!r}: unknown need(s) {unknown}; one of "
                             f"{sorted({*NEEDS, *CALCULATORS.names()})} (a new statistic: a Calculator)")

    @property
    def uses_equivalence(self) -> bool:
        """Whether the equivalence shapes its value (then its stored name says which)."""
        return bool(closure(self.needs) & {"clusters", "similarity"})

    def lacking(self, stats: QuestionStats) -> str | None:
        """The data need this question's answers do not meet, or None."""
        if "token_logprobs" in self.needs and not stats.has_logprobs:
            return "token_logprobs"
        if "option_probs" in self.needs and stats.option_probs is None:
            return "option_probs"
        if "answer_logprobs" in self.needs and stats.greedy_logprob_sum is None:
            return "answer_logprobs"
        return None

    @property
    def data_needs(self) -> frozenset[str]:
        """The DATA_NEEDS an engine must meet for it (the answer's own log-probabilities are token ones)."""
        return frozenset("token_logprobs" if n == "answer_logprobs" else n for n in self.needs) & set(DATA_NEEDS)

    @property
    def one_pass(self) -> bool:
        """Whether it reads the most likely answer only (its cost: one generation a question, no sample)."""
        return bool(self.needs) and self.needs <= ONE_PASS


def _needs(*names: str) -> frozenset[str]:
    return frozenset(names)


ESTIMATORS: Registry[Estimator] = Registry("estimator", (
    Estimator("semantic_entropy", semantic_entropy, _needs("clusters")),
    Estimator("semantic_entropy_weighted", semantic_entropy_weighted, _needs("clusters", "token_logprobs")),
    Estimator("num_semantic_sets", num_semantic_sets, _needs("clusters")),
    Estimator("predictive_entropy", predictive_entropy, _needs("token_logprobs")),
    Estimator("predictive_entropy_normalized", predictive_entropy_normalized, _needs("token_logprobs")),
    Estimator("lexical_similarity", lexical_similarity),
    Estimator("eigv", eigv, _needs("similarity")),
    Estimator("deg", deg, _needs("similarity")),
    Estimator("ecc", ecc, _needs("similarity")),
    Estimator("option_entropy", option_entropy, _needs("option_probs")),
    Estimator("one_minus_max_prob", one_minus_max_prob, _needs("option_probs")),
    Estimator("answer_nll", answer_nll, _needs("answer_logprobs")),
    Estimator("answer_nll_mean", answer_nll_mean, _needs("answer_logprobs")),
    Estimator("one_minus_answer_prob", one_minus_answer_prob, _needs("answer_logprobs")),
), base=Estimator, group="cic.estimators")


def unmet_by(names: Sequence[str], offered: set[str]) -> list[str]:
    """The estimators among `names` that need data an engine does not offer (`offered`: the DATA_NEEDS it
    gives): they store null, known from their declarations alone."""
    return [n for n in names if n in ESTIMATORS and ESTIMATORS[n].data_needs - offered]


def list_estimators() -> list[str]:
    """Every estimator name."""
    return list(ESTIMATORS)


def get_estimator(name: str) -> Estimator:
    """The estimator named `name`; a UserError naming the ones there are otherwise."""
    return ESTIMATORS.lookup(name)


def stored_name(name: str, equivalence_name: str, adaptive: Sequence[int] | None = None) -> str:
    """The name a score is stored under: "<name>[<equivalence>]" when the equivalence shapes it, then
    "[adaptive:2-10]" when it reads samples drawn under the adaptive rule (`cic.llm.uncertainty.adaptive`)."""
    from cic.llm.uncertainty.adaptive import adaptive_name

    estimator = get_estimator(name)
    named = f"{name}[{equivalence_name}]" if estimator.uses_equivalence else name
    return adaptive_name(named, adaptive) if adaptive and not estimator.one_pass else named


def finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
