"""The adaptive sample count: label-free by construction, stops exactly where the rule says, and its score is the
score of the samples it drew."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from cic.llm.uncertainty import adaptive
from cic.llm.uncertainty.adaptive import adaptive_name, adaptive_semantic_entropy, samples_drawn


@pytest.mark.parametrize(("clusters", "drawn"), [
    ([0] * 10, 2), ([0, 1] + [0] * 8, 10), ([0, 0, 0, 1, 0, 0, 0, 0, 0, 0], 2), ([0, 0, 1, 1, 0, 0, 0, 0, 0, 0], 2),
    ([0, 1, 0, 0, 0, 0, 0, 0, 0, 0], 10), (list(range(10)), 4), ([0, 1, 2, 3, 0, 0, 0, 0, 0, 0], 4),
    ([0, 1, 2, 2, 3, 4, 5, 6, 7, 8], 10), ([0, 1, 0, 2, 3, 4, 5, 6, 7, 8], 10)])
def test_it_stops_at_the_first_round_whose_samples_agree_or_all_differ(clusters: list[int], drawn: int) -> None:
    assert samples_drawn(clusters) == drawn
    score, used = adaptive_semantic_entropy(clusters)
    counts = np.unique(clusters[:drawn], return_counts=True)[1]
    assert used == drawn and score == pytest.approx(-sum(c / drawn * math.log(c / drawn) for c in counts))


def test_two_samples_that_differ_settle_nothing_four_do() -> None:
    assert not adaptive.settles([0, 1]) and not adaptive.settles([0, 1, 2])
    assert adaptive.settles([0, 1, 2, 3]) and adaptive.settles([5, 5]) and not adaptive.settles([0, 1, 2, 2])
    assert adaptive.stop_in([0, 1, 2, 3]) == 4 and adaptive.stop_in([0, 1, 2, 2]) is None


def test_a_later_round_settles_when_its_samples_agree() -> None:
    assert samples_drawn([3, 3, 3, 3], rounds=(2, 4)) == 2
    assert samples_drawn([1, 2, 1, 1, 1, 1], rounds=(2, 4, 6)) == 6
    assert samples_drawn([1, 2, 1, 1], rounds=(2, 4)) == 4


def test_the_rule_reads_samples_only_never_a_label() -> None:
    """No label reaches it: its functions take a question's meaning-set ids and the rounds, nothing else, so
    permuting the labels across questions leaves every stop and score as it was."""
    for function in (samples_drawn, adaptive_semantic_entropy):
        assert list(inspect.signature(function).parameters) == ["clusters", "rounds"]
    assert not {"label", "error", "correct"} & set(inspect.getsource(adaptive).split())


@pytest.mark.parametrize("rounds", [(), (1, 4), (4, 4), (6, 2)])
def test_rounds_must_grow_from_two(rounds: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="rounds"):
        samples_drawn([0] * 10, rounds)


def test_the_score_is_named_by_its_rule() -> None:
    assert adaptive_name("semantic_entropy") == "semantic_entropy[adaptive:2-10]"
    with pytest.raises(ValueError, match="samples given"):
        samples_drawn([0, 1, 2], (2, 4))


def test_meaning_sets_are_found_online_so_a_prefix_keeps_its_sets() -> None:
    """The replay of the rule on a full draw equals a run that stopped early only because an answer's meaning set
    depends on the answers before it: the sets of every prefix are the prefix of the sets."""
    from cic.llm.uncertainty import make_equivalence
    from cic.llm.uncertainty.equivalence import cluster_many

    rng = np.random.default_rng(0)
    words = ["Paris", "paris.", "Lyon", "The Paris", "Nice", "lyon"]
    draws = [[str(w) for w in rng.choice(words, 10)] for _ in range(50)]
    exact = make_equivalence("exact")
    whole = cluster_many(draws, exact)
    for k in (2, 4, 6):
        assert all((a[:k] == b).all() for a, b in zip(whole, cluster_many([d[:k] for d in draws], exact), strict=True))
