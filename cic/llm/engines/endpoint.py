"""A served model (an OpenAI-compatible server: vLLM, SGLang, TGI, llama.cpp's server, `transformers serve`, a
hosted API) answers: `cic.llm.endpoint` is its HTTP client. The run's one probe asks the server what it serves;
the workers adopt what it found instead of asking again."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.llm.engines.base import Capabilities, Engine, EngineProbe

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.endpoint_spec import EndpointSpec
    from cic.llm.settings import AnswererSettings


def endpoint_spec(settings: AnswererSettings) -> EndpointSpec:
    """The client's spec from the model's `endpoint` config (its fields that the client reads)."""
    from cic.llm.endpoint_spec import EndpointSpec

    options = dict(settings.engine_options or {})
    names = {f.name for f in dataclasses.fields(EndpointSpec)}
    return EndpointSpec(**{k: tuple(v) if k == "urls" else v for k, v in options.items() if k in names})


class EndpointEngine(Engine):
    """Answers from a server: no weights here, log-probabilities only where the server returns them."""

    name = "endpoint"

    def __init__(self, settings: AnswererSettings) -> None:
        super().__init__(settings)
        self.spec = endpoint_spec(settings)  # built once: prompts and capabilities read it every batch
        self._generator: Any = None
        self._moved_taken = 0  # moved requests already reported (`take_moved`)

    @classmethod
    def probe(cls, settings: AnswererSettings) -> EngineProbe:
        from cic.llm.endpoint import EndpointClient

        client = EndpointClient(endpoint_spec(settings))
        generation = settings.generation
        identity = client.probe(n_samples=generation.n_samples, temperature=generation.temperature)
        return EngineProbe(identity=identity, state=client.state())

    @classmethod
    def run_key(cls, settings: AnswererSettings, probe: EngineProbe) -> dict[str, Any]:
        """The served model's identity, its engine and version, what its log-probabilities are (raw or scaled by
        temperature) and its greedy answer to the identity check, beside the decoding settings: answers that differ
        in any of these are another run, never mixed into one."""
        from cic.llm.endpoint import SAMPLER

        state = probe.state or {}
        canary = state.get("canary") or {}
        return {"endpoint_model": probe.identity, "api": endpoint_spec(settings).api,
                **settings.generation.shaping(), "sampler": SAMPLER, "endpoint_engine": state.get("engine"),
                "logprobs_as": state.get("logprobs_as"), "endpoint_canary": canary.get("text"),
                "option_probs_from": "named token ids" if state.get("named_tokens") else None}

    @classmethod
    def describe(cls, probe: EngineProbe) -> str | None:
        return (probe.state or {}).get("described")

    @classmethod
    def certified_identity(cls, generation_config: dict[str, Any]) -> str | None:
        return generation_config.get("endpoint_model")

    @classmethod
    def gpus(cls, requested: float) -> float:
        return 0.0  # the server's GPUs are its own

    @property
    def generator(self) -> Any:
        """The client and its row builder (`cic.llm.endpoint_generator.EndpointGenerator`)."""
        if self._generator is None:
            from cic.llm.endpoint import EndpointClient
            from cic.llm.endpoint_generator import EndpointGenerator

            client = EndpointClient(self.spec, seed=self.settings.generation.seed)
            self._generator = EndpointGenerator(client, self.settings.generation)
        return self._generator

    def load(self) -> None:
        """Adopt the run's probe; without one (or with an identity only, as `cic ask` passes the certified one),
        probe now and refuse a server that now serves another model than the run was keyed on."""
        client = self.generator.client
        probe = self.settings.probe
        if probe is not None and probe.state is not None:
            client.adopt(probe.state)
            return
        served = client.probe()
        if probe is not None and probe.identity is not None and served != probe.identity:
            raise UserError(f"model {self.settings.model_spec}: the endpoint now serves {served!r}, but this run is "
                            f"keyed on {probe.identity!r}; start a new run for the new model")

    @property
    def loaded(self) -> bool:
        return self._generator is not None and self._generator.client.served_model is not None

    @property
    def capabilities(self) -> Capabilities:
        client = self.generator.client
        top = self.spec.top_logprobs > 0
        return Capabilities(token_logprobs=client.logprobs, option_probs=client.logprobs and (top or
                            client.named_tokens), seeds=True,
                            server_samples=client.server_n, local_weights=False)

    @property
    def device(self) -> Any:
        from cic.llm.models import pick_device

        return pick_device(self.settings.device)

    def prompts(self, rows: Sequence[dict[str, Any]], prompt_id: str | None) -> list[Any]:
        """Chat messages (the server applies its own template) or the plain few-shot text (completions API)."""
        from cic.data import build_messages, build_prompt

        build = build_messages if self.spec.api == "chat" else build_prompt
        return [build(row, prompt_id=prompt_id) for row in rows]

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[Any], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        return self.generator.generate_open(question_ids, prompts, run_key=run_key, indices=indices)

    def choose(self, question_ids: Sequence[str], prompts: Sequence[Any], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        return self.generator.choose(question_ids, prompts, choice_labels, run_key=run_key)

    def take_failures(self) -> dict[str, str]:
        failed = self.generator.stats.failed_questions
        taken = dict(failed)
        failed.clear()
        return taken

    def take_moved(self) -> int:
        moved = self.generator.stats.moved - self._moved_taken
        self._moved_taken = self.generator.stats.moved
        return moved

    @property
    def stats(self) -> Any:
        """Requests, retries, moved requests and tokens so far (`cic.llm.endpoint.EndpointStats`)."""
        return self.generator.stats

    def ready(self) -> dict[str, Any]:
        client = self.generator.client
        return {"model": self.settings.model_spec, "device": "endpoint", "dtype": None, "llm_loaded": self.loaded,
                "served_model": client.served_model, "offers": self.capabilities.offers()}
