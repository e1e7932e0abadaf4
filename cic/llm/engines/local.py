"""Weights CIC loads itself (a hub id, a local directory, a .gguf file): `cic.llm.models` loads them and
`cic.llm.generation.AnswerGenerator` runs the batched decode loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cic.llm.engines.base import Capabilities, Engine, EngineProbe

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.settings import AnswererSettings


class LocalEngine(Engine):
    """The model's own weights in the worker: log-probabilities of every token and option, seeded sampling."""

    name = "local"

    def __init__(self, settings: AnswererSettings) -> None:
        super().__init__(settings)
        self._loaded: Any = None
        self._generator: Any = None

    @classmethod
    def probe(cls, settings: AnswererSettings) -> EngineProbe:
        return EngineProbe(identity=None, state={})  # the spec keys the run; loading is the workers' job

    @classmethod
    def run_key(cls, settings: AnswererSettings, probe: EngineProbe) -> dict[str, Any]:
        return {"model_spec": settings.model_spec, **settings.generation.shaping(),
                # numerics shape the answers: an explicit dtype is its own run ("auto" keeps older keys)
                **({"dtype": settings.dtype} if settings.dtype != "auto" else {}),
                **({"quantization": settings.quantization} if settings.quantization != "none" else {})}

    def load(self) -> None:
        self.model  # noqa: B018 - load now, so a replica is ready only once its model is

    @property
    def model(self) -> Any:
        """The loaded causal LM (`cic.llm.models.LoadedModel`), loaded on first access."""
        if self._loaded is None:
            from cic.llm.models import ModelSpec, load_causal_lm

            s = self.settings
            spec = ModelSpec(s.model_spec, dtype=s.dtype, device=s.device, trust_remote_code=s.trust_remote_code,
                             quantization=s.quantization)
            self._loaded = load_causal_lm(spec, cache_dir=s.cache_dir, gpu_share=s.gpu_share)
        return self._loaded

    @property
    def generator(self) -> Any:
        """The decode loop (`cic.llm.generation.AnswerGenerator`) over the loaded model."""
        if self._generator is None:
            from cic.llm.generation import AnswerGenerator

            self._generator = AnswerGenerator(self.model, self.settings.generation)
        return self._generator

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_logprobs=True, option_probs=True, seeds=True, server_samples=False,
                            local_weights=True)

    @property
    def device(self) -> Any:
        if self._loaded is not None:
            return self._loaded.device
        from cic.llm.models import pick_device

        return pick_device(self.settings.device)

    def prompts(self, rows: Sequence[dict[str, Any]], prompt_id: str | None) -> list[Any]:
        from cic.data import build_prompt

        return [build_prompt(row, tokenizer=self.model.tokenizer, prompt_id=prompt_id) for row in rows]

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[Any], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        return self.generator.generate_open(question_ids, prompts, run_key=run_key, indices=indices)

    def choose(self, question_ids: Sequence[str], prompts: Sequence[Any], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        return self.generator.choose(question_ids, prompts, choice_labels, run_key=run_key)

    def ready(self) -> dict[str, Any]:
        if self._loaded is None:
            return {"model": self.settings.model_spec, "device": self.device, "dtype": None, "llm_loaded": False,
                    "offers": self.capabilities.offers()}
        return {"model": self.settings.model_spec, "device": self._loaded.device, "dtype": self._loaded.dtype,
                "llm_loaded": True, "offers": self.capabilities.offers()}
