"""The parts of a config that say what runs: the numeric limits every setting is checked against, the models (local
weights, a served endpoint, any registered engine with its options), the datasets and the generation settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cic.errors import UserError

# Upper limits of the numeric settings: far beyond any sensible run, low enough that a typo (an extra zero, a YAML
# .inf) is refused before anything starts instead of running for days or sampling from an infinite temperature
MAX_SAMPLES = 1_000
MAX_TEMPERATURE = 10.0
MAX_TOP_K = 1_000_000
MAX_NEW_TOKENS = 32_768
MAX_CONTEXT_TOKENS = 1_048_576
MAX_BATCH = 100_000  # rows per forward pass, questions per Ray batch
MAX_REPLICAS = 1_024
MAX_GPUS_PER_REPLICA = 64
MAX_QUESTIONS = 100_000_000  # dataset limit, n_min, recalibration window
MAX_SPLITS = 10_000
MAX_GRID = 100_000
MAX_CPUS = 65_536
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds both take it
MAX_WAIT_S = 30 * 24 * 3600.0  # timeouts: finite, at most 30 days
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


class _Strict(BaseModel):
    # allow_inf_nan=False: a YAML .inf or .nan is refused for every float (no bound catches NaN)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EndpointConfig(_Strict):
    """A served model: an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server, `transformers serve`,
    a hosted API) answers instead of weights CIC loads. Several URLs are replicas of one model."""

    urls: tuple[str, ...] = Field(min_length=1, max_length=MAX_REPLICAS,
                                  description="base URLs up to the API version, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(min_length=1, description="the served model's name, as the server expects it in requests")
    api: Literal["chat", "completions"] = "chat"
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the NAME of the "
                                    "environment variable holding the API key (the key is never written anywhere)")
    timeout_s: float = Field(120.0, gt=0, le=MAX_WAIT_S, description="one request's reply")
    retries: int = Field(4, ge=0, le=100, description="per request: 429, 5xx, timeouts, dropped connections")
    max_in_flight: int = Field(8, ge=1, le=4096, description="requests in flight per URL")
    max_requests: int | None = Field(None, ge=1, le=10**12, description="a budget per replica and run")
    max_tokens: int | None = Field(None, ge=1, le=10**15,
                                   description="a budget of generated (completion) tokens per replica and run")
    logprobs: Literal["auto", "on", "off"] = Field("auto", description="token log-probabilities: auto asks and "
                                                   "goes on without them when the server gives none")
    top_logprobs: int = Field(0, ge=0, le=20, description="per token; multiple choice reads option probabilities "
                              "from the first token's")
    max_failed_share: float = Field(0.0, ge=0, le=1, description="the share of questions that may stay unanswered "
                                    "after retries before the model's run fails")
    server_n: Literal["auto", "on", "off"] = Field("auto", description="a question's samples in one request "
                                                   "asking for n: auto where the server honours it (checked), "
                                                   "else one seeded request each")
    option_logprobs: Literal["auto", "top"] = Field("auto", description="multiple choice: auto asks the "
                                                    "option letters' own log-probabilities where the server takes "
                                                    "named token ids (vLLM's logprob_token_ids), else the top-k's")

    @field_validator("urls")
    @classmethod
    def _plain_http_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        from urllib.parse import urlsplit

        for i, url in enumerate(urls):
            try:
                parts = urlsplit(url)
                _ = parts.port  # an out-of-range port raises here
            except ValueError as exc:
                raise UserError(f"endpoint.urls.{i} = {url!r}: not a URL ({exc})") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UserError(f"endpoint.urls.{i} = {url!r}: give an http:// or https:// URL with a host")
            if parts.username is not None or parts.password is not None:
                raise UserError(f"endpoint.urls.{i}: a user or password in the URL would be stored with the run; "
                                "put the key in an environment variable and name it in endpoint.api_key_env")
            if parts.query or parts.fragment:
                raise UserError(f"endpoint.urls.{i} = {url!r}: no query or fragment; give the base URL")
        if len(set(urls)) != len(urls):
            raise UserError(f"endpoint.urls lists a URL twice: {sorted({u for u in urls if urls.count(u) > 1})}")
        return urls


class ModelConfig(_Strict):
    """One model: a short name (used in tables and MLflow) and one of: a spec the loader understands (weights CIC
    loads), an endpoint (a model a server answers for), or another registered engine with its options."""

    name: str = Field(min_length=1)
    spec: str | None = Field(None, min_length=1, description="hub id, local dir, .gguf file or pkg:<package>/<file>")
    endpoint: EndpointConfig | None = None
    engine: str | None = Field(None, min_length=1, description="a registered engine (cic.llm.engines.ENGINES) "
                               "other than the two above, configured by options")
    options: dict[str, Any] = Field(default_factory=dict, description="the engine's own options (its Options model)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Ray actors holding this model")
    gpus_per_replica: float | None = Field(None, ge=0, le=MAX_GPUS_PER_REPLICA,
                                           description="GPUs each replica asks Ray for: 1, 0.5 (two "
                                           "small models share a GPU), 0 = CPU; unset: a GPU on a cluster joined by "
                                           "address, on an in-process Ray only if this machine has one")
    allow_cpu_fallback: bool = Field(False, description="restart on CPU when no GPU replica starts in time")
    resources: dict[str, Annotated[float, Field(ge=0, le=1e9)]] = Field(
        default_factory=dict, description="custom Ray resources each replica asks "
                                        "for, e.g. {gpu_80gb: 1} to land on a node type that fits a 14B model")
    quantization: Literal["none", "int8", "int4"] = Field("none", description="bitsandbytes weights on a GPU: a 14B "
                                                          "model in int4 (~7 GB) fits a 24 GB GPU")
    trust_remote_code: bool = False

    @model_validator(mode="before")
    @classmethod
    def _options_of_the_engine(cls, data: Any) -> Any:
        """An engine's options, validated by its own `Options` model before anything else reads them."""
        if isinstance(data, dict) and isinstance(data.get("engine"), str) and data.get("spec") is None \
                and data.get("endpoint") is None:
            options = data.get("options") or {}
            if not isinstance(options, dict):
                raise UserError(f"model {data.get('name')!r}: options = {options!r}: a mapping of the engine's "
                                "settings")
            return {**data, "options": _engine_options(str(data.get("name")), data["engine"], options)}
        return data

    @model_validator(mode="after")
    def _spec_or_endpoint(self) -> ModelConfig:
        given = [k for k in ("spec", "endpoint", "engine") if getattr(self, k) is not None]
        if len(given) != 1:
            raise UserError(f"model {self.name!r}: give one of spec (weights cic loads), endpoint (a served model) "
                            "or engine (another registered engine, with options), not "
                            + (" and ".join(given) if given else "none"))
        if self.options and self.engine is None:
            raise UserError(f"model {self.name!r}: options belong to an engine; name it with engine")
        if self.spec is None:
            local = [k for k in ("dtype", "device", "gpus_per_replica", "quantization", "resources",
                                 "allow_cpu_fallback", "trust_remote_code") if k in self.model_fields_set]
            if local:
                raise UserError(f"model {self.name!r}: {', '.join(local)} shape(s) loaded weights; a model without "
                                "spec takes none of them")
        return self

    @property
    def kind(self) -> str:
        """The engine that answers (`cic.llm.engines.registry`): "endpoint" for a served model, "local" for
        weights cic loads, else the engine named."""
        return self.engine or ("endpoint" if self.endpoint is not None else "local")

    @property
    def max_failed_share(self) -> float:
        """The share of questions that may stay unanswered (a served model's `endpoint.max_failed_share`; 0 for
        weights cic loads, whose failures are errors; another engine says from its options)."""
        if self.engine is not None:
            from cic.llm.engines import engine_class

            return engine_class(self.engine).max_failed_share(self.options)
        return self.endpoint.max_failed_share if self.endpoint is not None else 0.0

    @property
    def source(self) -> str:
        """What the model is, in one string: its spec, the served model's name at its first URL, or what its engine
        says of its options."""
        if self.engine is not None:
            from cic.llm.engines import engine_class

            return engine_class(self.engine).source(self.options)
        if self.endpoint is not None:
            return f"{self.endpoint.model} @ {self.endpoint.urls[0]}"
        assert self.spec is not None
        return self.spec

    @model_validator(mode="after")
    def _quantization_needs_a_gpu(self) -> ModelConfig:
        if self.quantization != "none" and self.gpus_per_replica == 0:
            raise UserError(f"quantization = {self.quantization!r} needs a GPU, but gpus_per_replica = 0")
        return self


def _engine_options(model: str, engine: str, options: dict[str, Any]) -> dict[str, Any]:
    """An engine's options validated by its own `Options` model (one line naming the field and value otherwise)."""

    from cic.llm.engines import engine_class

    found = engine_class(engine)
    if found.name in ("local", "endpoint"):
        raise UserError(f"model {model!r}: engine = {engine!r} is configured by "
                        f"{'spec' if found.name == 'local' else 'endpoint'}, not by engine and options")
    if found.Options is None:
        if options:
            raise UserError(f"model {model!r}: engine {engine!r} takes no options (got {sorted(options)})")
        return {}
    try:
        return found.Options.model_validate(options).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"model {model!r}: options.{where} = {first.get('input')!r}: {first['msg']}") from None


class DatasetConfig(_Strict):
    """One dataset: a registry name, where to read it from, how many questions, which criteria label it."""

    name: str = Field(min_length=1)
    source: str = Field("bundled", description="bundled | hub | a local JSONL/Parquet file or directory")
    split: str = "validation"
    limit: int | None = Field(None, ge=1, le=MAX_QUESTIONS)
    seed: Seed = 0
    criteria: tuple[str, ...] = Field(default=(), description="empty: the dataset's default criterion")

    @field_validator("criteria")
    @classmethod
    def _known_criteria(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from cic.llm.alignment import parse_criterion

        return tuple(parse_criterion(c).label for c in value)


class GenerationSettings(_Strict):
    """Sampling settings (`cic.llm.generation.GenerationConfig`): one most-likely answer plus n_samples samples.

    `questions_per_batch` only decides how questions are sharded across Ray workers; it never changes a row.
    """

    n_samples: int = Field(10, ge=1, le=MAX_SAMPLES)
    temperature: float = Field(1.0, gt=0, le=MAX_TEMPERATURE)
    top_p: float = Field(0.9, gt=0, le=1)
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="0 = no top-k cut")
    most_likely_temperature: float = Field(0.0, ge=0, le=MAX_TEMPERATURE, description="0 = greedy")
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS)
    stop_at_newline: bool = True
    seed: Seed = 0
    batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="rows per forward pass; None adapts to "
                                   "memory")
    max_context_tokens: int | None = Field(None, ge=8, le=MAX_CONTEXT_TOKENS)
    questions_per_batch: int = Field(8, ge=1, le=MAX_BATCH)
    adaptive: tuple[int, ...] | None = Field(None, description="rounds as cumulative sample counts, e.g. [2, 4, 6, "
                                             "10]: a question stops once its samples share one meaning set, or "
                                             "(from 4) each has its own")
    keep_hidden: tuple[int, ...] = Field((), description="layers whose hidden states the greedy pass keeps, at the "
                                         "last prompt and answer token (local models; for probes), e.g. [-8, -1]")

    @model_validator(mode="after")
    def _rounds_fit(self) -> GenerationSettings:
        self.generation_config()  # one line naming the field where the rounds do not fit n_samples
        return self

    def generation_config(self) -> Any:
        """The `cic.llm.generation.GenerationConfig` these settings describe (imports torch-free module lazily)."""
        from cic.llm.generation import GenerationConfig

        return GenerationConfig(**self.model_dump(exclude={"questions_per_batch"}))


DEFAULT_ESTIMATORS: tuple[str, ...] = (
    "semantic_entropy", "semantic_entropy_weighted", "num_semantic_sets", "predictive_entropy",
    "predictive_entropy_normalized", "lexical_similarity", "eigv", "deg", "ecc", "option_entropy",
    "one_minus_max_prob", "answer_nll", "answer_nll_mean", "one_minus_answer_prob",
)


class ProbesConfig(_Strict):
    """Learned scores on the kept hidden states (`cic.llm.probes`), fitted after the answers are stored: `kinds`
    to fit (none by default), the share of each run's questions drawn (by id hash) as the accuracy probe's fit
    split — never certified on — and the positions whose states it reads."""

    kinds: tuple[Literal["accuracy", "semantic_entropy"], ...] = ()
    fit_share: float = Field(0.3, gt=0, lt=1)
    seed: int = Field(0, ge=0)
    positions: tuple[Literal["prompt", "answer"], ...] = Field(("prompt", "answer"), min_length=1)
