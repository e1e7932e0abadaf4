"""Session fixtures that load the offline models once: SmolLM2-135M (converted once into a session cache)
and all-MiniLM-L6-v2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cic_cache() -> Path:
    """The session's converted-model cache ($CIC_CACHE_DIR, set by tests/conftest.py)."""
    return Path(os.environ["CIC_CACHE_DIR"])


@pytest.fixture(scope="session")
def smollm(cic_cache: Path):
    from cic.llm.models import OFFLINE_DEFAULT_MODEL, load_causal_lm

    return load_causal_lm(OFFLINE_DEFAULT_MODEL, cache_dir=cic_cache)


@pytest.fixture(scope="session")
def minilm():
    from cic.llm.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder()
    embedder.encode(["warm up"])
    return embedder
