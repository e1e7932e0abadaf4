"""Clustering with few comparisons; embedding equivalence with MiniLM; NLI equivalence with a tiny classifier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cic.errors import UserError
from cic.llm.uncertainty import (
    EmbeddingEquivalence,
    ExactEquivalence,
    NliEquivalence,
    cluster_answers,
    cluster_many,
    entailment_decision,
    make_equivalence,
)


class CountingEquivalence:
    """Equal first letters, counting comparisons (stands for any model-based equivalence)."""

    name = "first-letter"

    def __init__(self) -> None:
        self.n_calls = 0

    def equivalent(self, answer: str, representatives: list[str]) -> np.ndarray:
        self.n_calls += len(representatives)
        return np.array([r[:1].lower() == answer[:1].lower() for r in representatives], dtype=bool)


def test_duplicates_merge_without_calls_and_new_answers_meet_one_representative_per_cluster() -> None:
    eq = CountingEquivalence()
    texts = ["Paris", "paris", "Paris.", "Peking", "London", "Lyon", "Berlin", "london"]
    ids = cluster_answers(texts, eq)
    assert ids.tolist() == [0, 0, 0, 0, 1, 1, 2, 1]
    # distinct normalised answers: paris, peking, london, lyon, berlin -> calls 0 + 1 + 1 + 2 + 2
    assert eq.n_calls == 6 <= len(texts) * 3 < len(texts) ** 2


class BatchCountingEquivalence(CountingEquivalence):
    """Also answers many queries at once, counting the batched calls."""

    def __init__(self) -> None:
        super().__init__()
        self.n_batches = 0

    def equivalent_many(self, queries: list[tuple[str, list[str]]]) -> list[np.ndarray]:
        self.n_batches += 1
        return [self.equivalent(answer, reps) for answer, reps in queries]


def test_clustering_many_questions_in_lockstep_equals_one_at_a_time() -> None:
    questions = [["Paris", "paris", "Peking", "London", "Lyon", "Berlin", "london"], ["a", "b", "c"], [],
                 ["Rome", "rome", "Rome."], ["x", "y", "x", "z", "yy", "zz", "w", "v"]]
    one_by_one = CountingEquivalence()
    expected = [cluster_answers(texts, one_by_one) for texts in questions]
    batched = BatchCountingEquivalence()
    got = cluster_many(questions, batched)
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    assert batched.n_calls == one_by_one.n_calls
    assert batched.n_batches <= max(len(t) for t in questions) - 1  # one call per round, not per answer


def test_nli_batched_across_questions_equals_one_question_at_a_time(tiny_nli: Path) -> None:
    questions = [["paris", "london", "a city", "the capital"], ["london", "is", "paris", "city"], ["a", "the"]]
    alone = make_equivalence("nli", nli_model=str(tiny_nli), variant="no_contradiction")
    together = make_equivalence("nli", nli_model=str(tiny_nli), variant="no_contradiction")
    expected = [cluster_answers(texts, alone).tolist() for texts in questions]
    assert [ids.tolist() for ids in cluster_many(questions, together)] == expected
    assert together.n_calls == alone.n_calls


def test_exact_equivalence_normalises() -> None:
    assert cluster_answers(["The Beatles", "beatles!", "Stones"], ExactEquivalence()).tolist() == [0, 0, 1]


def test_entailment_variants_differ_on_neutral_pairs() -> None:
    labels = {"entail": 2, "contradict": 0}
    neutral = np.array([[0.0, 1.0, 0.0]])
    entail = np.array([[0.0, 0.0, 1.0]])
    contra = np.array([[1.0, 0.0, 0.0]])
    assert entailment_decision(entail, entail, variant="strict", **labels).tolist() == [True]
    assert entailment_decision(entail, neutral, variant="strict", **labels).tolist() == [False]
    assert entailment_decision(entail, neutral, variant="no_contradiction", **labels).tolist() == [True]
    assert entailment_decision(contra, entail, variant="no_contradiction", **labels).tolist() == [False]
    with pytest.raises(UserError, match="nli_variant = 'loose'"):
        entailment_decision(entail, entail, variant="loose", **labels)


@pytest.fixture(scope="module")
def tiny_nli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 3-label BERT classifier with an MNLI label map and a tiny WordPiece vocabulary."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    path = tmp_path_factory.mktemp("tiny-nli")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "paris", "london", "is", "the", "capital", "a", "city"]
    (path / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    config = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=3,
                        id2label={0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"},
                        label2id={"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2})
    BertForSequenceClassification(config).save_pretrained(path)
    return path


def test_nli_equivalence_runs_a_real_classifier_both_ways(tiny_nli: Path) -> None:
    eq = make_equivalence("nli", nli_model=str(tiny_nli), variant="no_contradiction")
    assert isinstance(eq, NliEquivalence) and eq.name == f"nli-no_contradiction:{tiny_nli.name}"
    out = eq.equivalent("paris", ["london", "the capital", "a city"])
    assert out.shape == (3,) and out.dtype == bool and eq.n_calls == 3
    ids = cluster_answers(["paris", "Paris", "london", "a city"], eq)
    assert ids[0] == ids[1] and len(ids) == 4


def test_nli_model_without_an_entailment_label_is_refused(tiny_nli: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_nli)
    model.config.id2label = {0: "a", 1: "b", 2: "c"}
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_nli).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="lacks 'entailment'"):
        NliEquivalence(str(tmp_path))


@pytest.mark.slow
def test_embedding_equivalence_with_minilm_groups_paraphrases(minilm) -> None:
    eq = EmbeddingEquivalence(minilm, threshold=0.8)
    ids = cluster_answers(["Paris", "Paris, France", "the city of Paris", "Tokyo", "Tokyo, Japan"], eq)
    assert ids[0] != ids[3] and ids[3] == ids[4]
    assert eq.n_calls <= 5 * len(set(ids.tolist()))


@pytest.mark.slow
def test_loading_the_embedding_model_prints_no_progress_bar() -> None:
    """A fresh process loads the bundled embedder and embeds one answer: nothing on stderr (transformers' "Loading
    weights" bar would land on every command's console and in every pipeline log)."""
    import subprocess
    import sys

    code = "from cic.llm.embeddings import SentenceEmbedder; print(SentenceEmbedder().encode(['an answer']).shape)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "(1, 384)", proc.stderr[-2000:]
    assert proc.stderr == ""
