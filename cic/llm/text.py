"""Answer text utilities: SQuAD-style normalisation, tokens, token F1 and ROUGE-L."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and articles, collapse whitespace (the SQuAD evaluation script's rule)."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def tokens(text: str) -> list[str]:
    """Normalised word tokens."""
    return normalize_answer(text).split()


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 between two answers (1.0 when both normalise to nothing)."""
    pred, ref = tokens(prediction), tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _lcs(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(a: str, b: str) -> float:
    """ROUGE-L F-measure (longest common subsequence of normalised tokens); 1.0 for two empty answers."""
    x, y = tokens(a), tokens(b)
    if not x or not y:
        return float(x == y)
    lcs = _lcs(x, y)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(x), lcs / len(y)
    return 2 * precision * recall / (precision + recall)
