"""Semantic equivalence of answers, and clustering answers into meaning classes with few model calls.

Exact and normalised-string duplicates are merged before any model is asked; every new distinct answer is
then compared with one representative per existing cluster, so the number of comparisons is at most
K × clusters instead of K² all pairs. `cluster_many` clusters many questions in lockstep: each round takes
the next answer of every question and asks the model about all of them in one batched call (NLI), or encodes
every answer of every question in one call first (embeddings), with the same result as one question at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from cic.errors import UserError
from cic.llm.text import normalize_answer

NLI_VARIANTS = ("strict", "no_contradiction")


class Equivalence(Protocol):
    name: str
    n_calls: int

    def equivalent(self, answer: str, representatives: Sequence[str]) -> np.ndarray:
        """Boolean per representative: does `answer` mean the same?"""
        ...


def equivalent_many(equivalence: Any, queries: Sequence[tuple[str, Sequence[str]]]) -> list[np.ndarray]:
    """`equivalent` for many (answer, representatives) queries: one batched call where the kind has one."""
    batched = getattr(equivalence, "equivalent_many", None)
    if batched is not None:
        return batched(queries)
    return [equivalence.equivalent(answer, reps) for answer, reps in queries]


def equivalence_name(kind: str, *, threshold: float = 0.9, embedding_model: str | None = None,
                     nli_model: str | None = None, variant: str = "strict") -> str:
    """The name an equivalence gives the scores it shapes ("embedding:0.9", "nli-strict:deberta-large-mnli"),
    known without loading anything: the pipeline plans re-scoring from it."""
    from cic.llm.embeddings import DEFAULT_EMBEDDING_MODEL

    if kind == "exact":
        return "exact"
    if kind == "embedding":
        model = embedding_model or DEFAULT_EMBEDDING_MODEL
        suffix = "" if model == DEFAULT_EMBEDDING_MODEL else f":{model.rstrip('/').split('/')[-1]}"
        return f"embedding:{float(threshold):g}{suffix}"
    if kind == "nli":
        return f"nli-{variant}:{(nli_model or '').rstrip('/').split('/')[-1]}"
    raise UserError(f"equivalence = {kind!r}: choose from exact, embedding, nli")


class ExactEquivalence:
    """Equal after SQuAD normalisation (no model)."""

    name = "exact"

    def __init__(self) -> None:
        self.n_calls = 0

    def equivalent(self, answer: str, representatives: Sequence[str]) -> np.ndarray:
        key = normalize_answer(answer)
        return np.array([normalize_answer(r) == key for r in representatives], dtype=bool)


class EmbeddingEquivalence:
    """Cosine similarity of sentence embeddings ≥ threshold (the offline default, MiniLM)."""

    def __init__(self, embedder: Any, threshold: float = 0.9) -> None:
        if not 0 < threshold <= 1:
            raise UserError(f"embedding_threshold = {threshold!r}: must lie in (0, 1]")
        self.embedder, self.threshold = embedder, float(threshold)
        self.name = equivalence_name("embedding", threshold=self.threshold,
                                     embedding_model=getattr(embedder, "spec", None))
        self.n_calls = 0

    def equivalent(self, answer: str, representatives: Sequence[str]) -> np.ndarray:
        if not representatives:
            return np.zeros(0, dtype=bool)
        self.n_calls += len(representatives)
        vectors = self.embedder.encode([answer, *representatives])
        return vectors[1:] @ vectors[0] >= self.threshold

    def prepare(self, texts: Sequence[str]) -> None:
        """Encode every text the clustering will compare in one batched call (the embedder caches them)."""
        self.embedder.encode(list(texts))

    def similarities(self, texts: Sequence[str]) -> np.ndarray:
        """Symmetric [K, K] similarity in [0, 1]: clipped cosine of the embeddings, 1 on the diagonal (the graph
        estimators read it; an equivalence without this method gives them its 0/1 same-class adjacency)."""
        vectors = self.embedder.encode(list(texts))
        sim = np.clip(vectors @ vectors.T, 0.0, 1.0).astype(np.float64)
        np.fill_diagonal(sim, 1.0)
        return sim


def entailment_decision(forward: np.ndarray, backward: np.ndarray, *, entail: int, contradict: int,
                        variant: str) -> np.ndarray:
    """Bidirectional decision from NLI logits [n, labels] of (a ⇒ b) and (b ⇒ a).

    strict: both directions' arg-max is entailment (Kuhn et al., 2023). no_contradiction: neither direction's
    arg-max is contradiction (the looser variant of Farquhar et al., 2024).
    """
    if variant == "strict":
        return (forward.argmax(-1) == entail) & (backward.argmax(-1) == entail)
    if variant == "no_contradiction":
        return (forward.argmax(-1) != contradict) & (backward.argmax(-1) != contradict)
    raise UserError(f"nli_variant = {variant!r}: choose from {', '.join(NLI_VARIANTS)}")


class NliEquivalence:
    """Bidirectional entailment with any MNLI-style sequence classifier (hub id, local dir or pkg: spec)."""

    def __init__(self, model: str, *, variant: str = "strict", device: str | None = None, batch_size: int = 32,
                 question: str | None = None) -> None:
        if variant not in NLI_VARIANTS:
            raise UserError(f"nli_variant = {variant!r}: choose from {', '.join(NLI_VARIANTS)}")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from cic.llm.paths import is_package_spec, resolve_package_path

        location = str(resolve_package_path(model)) if is_package_spec(model) else model
        self.tokenizer = AutoTokenizer.from_pretrained(location)
        self.model = AutoModelForSequenceClassification.from_pretrained(location).to(device or "cpu").eval()
        labels = {str(v).lower(): int(k) for k, v in self.model.config.id2label.items()}
        if "entailment" not in labels or "contradiction" not in labels:
            raise UserError(f"nli_model {model!r}: id2label {self.model.config.id2label} lacks 'entailment' and "
                             "'contradiction' (is it an MNLI classifier?)")
        self.entail, self.contradict = labels["entailment"], labels["contradiction"]
        self.variant, self.batch_size, self.device = variant, batch_size, device or "cpu"
        self.name = equivalence_name("nli", nli_model=model, variant=variant)
        self.n_calls = 0
        self._torch = torch

    def _logits(self, premises: list[str], hypotheses: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(premises), self.batch_size):
            batch = self.tokenizer(premises[start:start + self.batch_size], hypotheses[start:start + self.batch_size],
                                   padding=True, truncation=True, return_tensors="pt").to(self.device)
            with self._torch.inference_mode():
                out.append(self.model(**batch).logits.float().cpu().numpy())
        return np.concatenate(out)

    def equivalent(self, answer: str, representatives: Sequence[str]) -> np.ndarray:
        if not representatives:
            return np.zeros(0, dtype=bool)
        reps = list(representatives)
        self.n_calls += len(reps)
        logits = self._logits([answer] * len(reps) + reps, reps + [answer] * len(reps))
        return entailment_decision(logits[:len(reps)], logits[len(reps):], entail=self.entail,
                                   contradict=self.contradict, variant=self.variant)

    def equivalent_many(self, queries: Sequence[tuple[str, Sequence[str]]]) -> list[np.ndarray]:
        """Every query's pairs, both directions, in one run of batched forward passes."""
        premises: list[str] = []
        hypotheses: list[str] = []
        for answer, reps in queries:
            premises += [answer] * len(reps) + list(reps)
            hypotheses += list(reps) + [answer] * len(reps)
        if not premises:
            return [np.zeros(0, dtype=bool) for _ in queries]
        logits = self._logits(premises, hypotheses)
        out, at = [], 0
        for _, reps in queries:
            n = len(reps)
            self.n_calls += n
            out.append(entailment_decision(logits[at:at + n], logits[at + n:at + 2 * n], entail=self.entail,
                                           contradict=self.contradict, variant=self.variant))
            at += 2 * n
        return out


def make_equivalence(kind: str, *, embedder: Any = None, threshold: float = 0.9, nli_model: str | None = None,
                     variant: str = "strict", device: str | None = None) -> Any:
    """"exact", "embedding" (needs embedder) or "nli" (needs nli_model; runs on `device`, CPU by default)."""
    if kind == "exact":
        return ExactEquivalence()
    if kind == "embedding":
        if embedder is None:
            raise UserError("equivalence 'embedding' needs a sentence embedder")
        return EmbeddingEquivalence(embedder, threshold)
    if kind == "nli":
        if not nli_model:
            raise UserError("equivalence 'nli' needs nli_model (hub id or local path of an MNLI classifier)")
        return NliEquivalence(nli_model, variant=variant, device=device)
    raise UserError(f"equivalence = {kind!r}: choose from exact, embedding, nli")


def cluster_answers(texts: Sequence[str], equivalence: Any) -> np.ndarray:
    """Cluster ids (0, 1, ... in first-seen order) grouping answers that mean the same."""
    ids = np.empty(len(texts), dtype=np.int64)
    by_key: dict[str, int] = {}
    representatives: list[str] = []
    for i, text in enumerate(texts):
        key = normalize_answer(text)
        if key in by_key:  # duplicate after normalisation: no model call
            ids[i] = by_key[key]
            continue
        same = equivalence.equivalent(text, representatives) if representatives else np.zeros(0, dtype=bool)
        hit = int(np.argmax(same)) if same.any() else -1
        if hit < 0:
            hit = len(representatives)
            representatives.append(text)
        by_key[key] = hit
        ids[i] = hit
    return ids


def cluster_many(text_lists: Sequence[Sequence[str]], equivalence: Any) -> list[np.ndarray]:
    """`cluster_answers` for many questions at once, batching each round's model calls across questions."""
    prepare = getattr(equivalence, "prepare", None)
    if prepare is not None:
        every = [text for texts in text_lists for text in texts]
        if every:
            prepare(every)
    ids = [np.empty(len(texts), dtype=np.int64) for texts in text_lists]
    by_key: list[dict[str, int]] = [{} for _ in text_lists]
    representatives: list[list[str]] = [[] for _ in text_lists]
    for position in range(max((len(t) for t in text_lists), default=0)):
        asking: list[tuple[int, str, str]] = []
        for q, texts in enumerate(text_lists):
            if position >= len(texts):
                continue
            text = texts[position]
            key = normalize_answer(text)
            if key in by_key[q]:
                ids[q][position] = by_key[q][key]
            elif not representatives[q]:
                by_key[q][key] = ids[q][position] = 0
                representatives[q].append(text)
            else:
                asking.append((q, text, key))
        if not asking:
            continue
        answers = equivalent_many(equivalence, [(text, list(representatives[q])) for q, text, _ in asking])
        for (q, text, key), same in zip(asking, answers, strict=True):
            hit = int(np.argmax(same)) if same.any() else -1
            if hit < 0:
                hit = len(representatives[q])
                representatives[q].append(text)
            by_key[q][key] = ids[q][position] = hit
    return ids
