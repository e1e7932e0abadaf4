"""One model's answering stage: questions → generations → uncertainty scores → alignment labels.

An `Answerer` holds a loaded causal LM, the sentence embedder and the uncertainty scorer, so a Ray actor (or
`cic ask`) builds it once and reuses it for every batch. It returns polars frames shaped for the store's
`generations`, `scores` and `labels` tables and never writes anything: only the flow writes DuckDB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cic.llm.settings import AnswererSettings

if TYPE_CHECKING:
    import polars as pl


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

    The engine (`cic.llm.engines`) is loaded on first use: a worker that only re-scores stored generations (a new
    estimator or criterion) never loads it (`load_llm=False` says so up front; `llm_loaded` tells).
    """

    def __init__(self, settings: AnswererSettings, *, load_llm: bool = True) -> None:
        from cic.llm.embeddings import SentenceEmbedder
        from cic.llm.engines import make_engine
        from cic.llm.uncertainty import UncertaintyScorer, make_equivalence

        self.settings = settings
        self.engine = make_engine(settings)
        if load_llm:
            self.engine.load()  # now, so a replica is ready only once its model (or its server) is
        device = self.engine.device
        self.device = device  # embedder and NLI share the LLM's device
        self.embedder = SentenceEmbedder(settings.embedding_model, device=device)
        equivalence = make_equivalence(settings.equivalence, embedder=self.embedder,
                                       threshold=settings.embedding_threshold, nli_model=settings.nli_model,
                                       variant=settings.nli_variant, device=device)
        self.scorer = UncertaintyScorer(equivalence, settings.estimators, adaptive=settings.generation.adaptive)

    @property
    def llm_loaded(self) -> bool:
        return self.engine.loaded

    def ready(self) -> dict[str, Any]:
        """What this worker runs on (answers once the model is loaded: Ray placement waits for it)."""
        return self.engine.ready()

    def prompts(self, questions: pl.DataFrame, prompt_id: str | None = None) -> list[Any]:
        """The prompt of every question in the form the engine takes (a loaded model's chat template, a server's
        chat messages or plain few-shot text)."""
        if not self.engine.loaded:
            self.engine.load()
        return self.engine.prompts(list(questions.iter_rows(named=True)), prompt_id)

    def generate(self, questions: pl.DataFrame, *, run_key: str, prompt_id: str | None = None,
                 only_most_likely: bool = False) -> pl.DataFrame:
        """Most-likely answer plus samples for every question (GENERATIONS rows): all at once, or in adaptive rounds
        (`cic.llm.rounds`) where the generation settings name them; `only_most_likely`: no sample (a one-pass score
        reads none; never for rows a run stores, which later estimators may read)."""
        from cic.llm.generation import generate_for_questions
        from cic.llm.rounds import draw_in_rounds

        prompts = self.prompts(questions, prompt_id)
        rounds = self.settings.generation.adaptive
        if only_most_likely:
            return generate_for_questions(self.engine, questions, prompts, run_key=run_key, open_rows=lambda i, p:
                                          self.engine.generate_open(i, p, run_key=run_key, indices=[0]))
        if rounds is None:
            return generate_for_questions(self.engine, questions, prompts, run_key=run_key)

        def in_rounds(ids: list[str], open_prompts: list[Any]) -> pl.DataFrame:
            return draw_in_rounds(self.engine, ids, open_prompts, run_key=run_key, rounds=rounds,
                                  equivalence=self.scorer.equivalence).rows

        return generate_for_questions(self.engine, questions, prompts, run_key=run_key, open_rows=in_rounds)

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
        self.engine.take_failures()  # this batch's failures only
        fresh = self.generate(todo, run_key=run_key, prompt_id=prompt_id) if todo.height else stored.clear()
        generated_s = time.perf_counter() - started
        every = pl.concat([schema.conform(stored, schema.GENERATIONS), schema.conform(fresh, schema.GENERATIONS)])
        answered = questions.filter(pl.col("question_id").is_in(every.get_column("question_id").unique().to_list()))
        failures = self.engine.take_failures() if todo.height else {}
        scores, labels = self.score_and_label(answered, every, run_key=run_key, criteria=criteria)
        return AnswerBatch(generations=fresh, scores=scores, labels=labels, failures=failures, stats={
            "questions": float(answered.height), "generated_questions": float(todo.height - len(failures)),
            "generated_tokens": float(fresh.get_column("n_tokens").sum() or 0) if fresh.height else 0.0,
            "generations": float(generations_drawn(fresh)),
            "failed_questions": float(questions.height - answered.height),
            "moved_requests": float(self.engine.take_moved()),
            "generate_s": generated_s, "score_label_s": time.perf_counter() - started - generated_s})


def generations_drawn(rows: pl.DataFrame) -> int:
    """Generations a batch cost: every free-text row (the most likely answer and each sample is one decode), and
    one forward pass per multiple-choice question (its sampled letters are draws from that one distribution)."""
    if rows.height == 0:
        return 0
    mc = rows.get_column("option_probs").is_not_null()
    return int((~mc).sum()) + rows.filter(mc).get_column("question_id").n_unique()
