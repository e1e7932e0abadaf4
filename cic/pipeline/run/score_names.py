"""Score names, resolved once: the name under which CIC computes an estimator's score with given uncertainty
settings (`semantic_entropy` is stored as `semantic_entropy[embedding:0.9]`: the equivalence shapes it), so an
ingested `score:<name>` column that `cic ask` could never compute is said at ingest, and refused by `cic ask`
before any model loads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cic.schema import estimator_base


def computed_name(uncertainty: Any, stored: str, adaptive: Any = None) -> str | None:
    """The name a score of `stored`'s estimator gets under these `UncertaintyConfig` settings (and adaptive rounds,
    `generation.adaptive`); None: no estimator of that name exists (the score came from elsewhere and only its
    stored values can be served)."""
    from cic.llm.uncertainty.estimators import ESTIMATORS

    base = estimator_base(stored)
    if base not in ESTIMATORS:
        return None
    return str(uncertainty.model_copy(update={"estimators": (base,)}).score_names(adaptive)[0])


def ingest_notes(names: Iterable[str]) -> list[str]:
    """One warning per ingested score name that `cic ask` cannot compute under the default uncertainty settings,
    with the spelling it can."""
    from cic.pipeline.config import UncertaintyConfig

    default, notes = UncertaintyConfig(), []
    for name in sorted(set(names)):
        computed = computed_name(default, name)
        if computed is None:
            notes.append(f"score {name!r}: no CIC estimator computes it, so `cic ask` cannot score a new question "
                         "for its gates (they serve through `cic gate export`)")
        elif computed != name:
            notes.append(f"score {name!r}: `cic ask` computes this estimator as {computed!r} (default uncertainty "
                         f"settings); name the column `score:{computed}` for `cic ask` to serve its gates")
    return notes
