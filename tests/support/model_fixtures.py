"""Session fixtures that load the offline models once: SmolLM2-135M (converted once into a session cache)
and all-MiniLM-L6-v2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cic_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The converted-model cache: $CIC_CACHE_DIR if the caller set one, else a session temp dir."""
    preset = os.environ.get("CIC_CACHE_DIR")
    path = Path(preset) if preset else tmp_path_factory.mktemp("cic-cache")
    os.environ["CIC_CACHE_DIR"] = str(path)
    yield path
    if not preset:
        os.environ.pop("CIC_CACHE_DIR", None)


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
