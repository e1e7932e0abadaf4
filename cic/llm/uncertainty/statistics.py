"""One question's generations and its shared, expensive statistics: each computed once by its calculator
(`cic.llm.uncertainty.calculators`, after what it depends on) and read by every estimator. Samples are the K sampled
answers (sample_index ≥ 1), as in Kuhn et al. (2023)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class QuestionStats:
    """One question's generations and the statistics estimators need (computed lazily, once)."""

    question_id: str
    texts: list[str]                     # the K samples
    logprob_sum: np.ndarray
    logprob_mean: np.ndarray
    option_probs: np.ndarray | None      # multiple choice only
    equivalence: Any
    has_logprobs: bool = True            # False when the generator returned no token log-probabilities (a server)
    greedy_logprob_sum: float | None = None   # the most likely answer's own (sample_index 0), when it came with them
    greedy_logprob_mean: float | None = None
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def is_multiple_choice(self) -> bool:
        return self.option_probs is not None

    def stat(self, name: str) -> Any:
        """A statistic (`cic.llm.uncertainty.calculators`), computed once; what it depends on is computed when its
        calculator reads it (`depends_on` is checked — known names, no cycle — before anything runs), so a graded
        equivalence's similarity never clusters."""
        if name not in self._cache:
            from cic.llm.uncertainty.calculators import CALCULATORS, calculation_order

            calculation_order([name])
            self._cache[name] = CALCULATORS[name].compute(self)
        return self._cache[name]

    @property
    def clusters(self) -> np.ndarray:
        """Meaning classes of the samples (letters are compared exactly for multiple choice)."""
        return self.stat("clusters")

    def first(self, count: int) -> QuestionStats:
        """The same question with its first `count` samples only (the adaptive rule's stop): its meaning sets are
        the prefix of these (they are found online), every other statistic is computed afresh."""
        from dataclasses import replace

        cached = {"clusters": self._cache["clusters"][:count]} if "clusters" in self._cache else {}
        return replace(self, texts=self.texts[:count], logprob_sum=self.logprob_sum[:count],
                       logprob_mean=self.logprob_mean[:count], _cache=cached)

    def set_clusters(self, ids: np.ndarray) -> None:
        """Meaning classes found elsewhere (batched across questions by the scorer)."""
        if len(ids) != len(self.texts):
            raise ValueError(f"question {self.question_id!r}: {len(ids)} cluster ids for {len(self.texts)} samples")
        self._cache["clusters"] = np.asarray(ids, dtype=np.int64)

    @property
    def similarity(self) -> np.ndarray:
        """Symmetric [K, K] similarity in [0, 1] for the graph estimators."""
        return self.stat("similarity")

    @property
    def laplacian_eigen(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues (ascending) and eigenvectors of L = I − D^{-1/2} W D^{-1/2}."""
        return self.stat("laplacian_eigen")
