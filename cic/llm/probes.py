"""Probes: learned scores on the hidden states the greedy pass kept (`cic.llm.hidden`), certified on other questions.

Two kinds, both linear on standardised states (scikit-learn fits them; scoring is numpy alone, so `cic ask` needs
no scikit-learn):

- `semantic_entropy`: ridge regression onto the sampled semantic entropy of the same questions (Kossen et al.,
  2024). Label-free, so it may be fitted on any questions, calibration ones included; serving it costs the one
  greedy pass instead of eleven.
- `accuracy`: logistic regression onto the error labels (1 - aligned) of one criterion; its score is P(error).
  Fitting a score on the labels that certify it voids the guarantee, so it is fitted only on a *fit split*
  (`fit_split`: each question in with probability `share`, by a hash of the seed and its id — drawn once per group,
  the same for every criterion), recorded in the probe (`fit_ids`, `fit_digest`) and in the name of every score it
  makes; `check_disjoint` refuses a calibration or evaluation that includes one of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cic.errors import UserError
from cic.schema import stable_hash

KINDS = ("accuracy", "semantic_entropy")
FORMAT = 1  # the artifact's layout version
RIDGE_ALPHAS = tuple(float(a) for a in np.logspace(-1, 6, 15))
LOGISTIC_CS = tuple(float(c) for c in np.logspace(-5, 1, 7))


def fit_split(question_ids: Sequence[str], share: float = 0.3, seed: int = 0) -> list[str]:
    """The questions a probe may be fitted on, in the given order: each with probability `share`, decided by a
    hash of (seed, id) alone, so the draw is fixed before any label is read and the same on every rerun."""
    if not 0 < share < 1:
        raise UserError(f"fit_share = {share!r}: must be in (0, 1)")
    cut = int(share * 2**32)
    return [q for q in question_ids if int(stable_hash(str(seed), str(q), length=8), 16) < cut]


def ids_digest(question_ids: Sequence[str]) -> str:
    """A short digest of a set of question ids (order and repeats do not matter)."""
    return stable_hash(*sorted(set(map(str, question_ids))), length=12)


@dataclass(frozen=True)
class Probe:
    """A fitted probe and its provenance: the model and layers whose states it reads, what it predicts (`target`:
    the criterion of an accuracy probe, the estimator of an entropy probe) and the questions it was fitted on."""

    kind: str
    model: str
    layers: tuple[int, ...]
    positions: tuple[str, ...]
    target: str
    fit_ids: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    regularisation: float  # the ridge alpha or the logistic C chosen by cross-validation on the fit split
    fitted_with: str = ""  # scikit-learn version
    version: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"probe kind = {self.kind!r}: use {' or '.join(KINDS)}")
        if not len(self.mean) == len(self.scale) == len(self.coef):
            raise UserError(f"probe {self.kind}: mean, scale and coef differ in length")

    @property
    def fit_digest(self) -> str:
        return ids_digest(self.fit_ids)

    @property
    def estimator(self) -> str:
        """The name its scores are stored under: kind, target and fit split, so every certificate made on them
        names the questions the probe was fitted on."""
        return f"probe_{self.kind}[{self.target}:{self.fit_digest}]"

    def score(self, features: np.ndarray) -> np.ndarray:
        """Scores, higher = more uncertain: P(error) for an accuracy probe, predicted semantic entropy otherwise."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.coef):
            raise UserError(f"probe {self.estimator}: features of shape {x.shape}, expected (n, {len(self.coef)}) "
                            f"(layers {list(self.layers)}, positions {list(self.positions)})")
        z = ((x - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.coef) + self.intercept
        return 1.0 / (1.0 + np.exp(-z)) if self.kind == "accuracy" else z

    def check_disjoint(self, question_ids: Sequence[str], where: str) -> None:
        """Refuse certifying on a question the probe was fitted on (a label-free entropy probe is never refused)."""
        if self.kind != "accuracy":
            return
        fitted = set(self.fit_ids)
        shared = [q for q in map(str, question_ids) if q in fitted]
        if shared:
            raise UserError(f"{where}: {len(shared)} question(s) that probe {self.estimator} was fitted on (first: "
                            f"{shared[0]}); a score fitted on the labels that certify it voids the guarantee — "
                            "certify on questions outside its fit split")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Probe:
        try:
            raw = json.loads(text)
            if raw.get("version") != FORMAT:
                raise UserError(f"probe artifact version {raw.get('version')!r}: this CIC reads version {FORMAT}")
            tuples = ("layers", "positions", "fit_ids", "mean", "scale", "coef")
            return cls(**{k: tuple(v) if k in tuples else v for k, v in raw.items()})
        except (ValueError, TypeError, AttributeError) as exc:
            raise UserError(f"not a CIC probe artifact ({str(exc).splitlines()[0][:120]})") from None


def parse_estimator(name: str) -> tuple[str, str, str] | None:
    """(kind, target, fit digest) of a probe's stored score name, or None for any other estimator."""
    for kind in KINDS:
        prefix = f"probe_{kind}["
        if name.startswith(prefix) and name.endswith("]") and ":" in name:
            target, digest = name[len(prefix):-1].rsplit(":", 1)
            return kind, target, digest
    return None


def _standardised(features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    return (x - mean) / scale, mean, scale


def _checked(features: np.ndarray, target: np.ndarray, ids: Sequence[str], what: str) -> None:
    if len(ids) != features.shape[0] or target.shape[0] != features.shape[0]:
        raise UserError(f"{what}: {features.shape[0]} feature rows, {target.shape[0]} targets, {len(ids)} ids")
    if len(set(ids)) != len(ids):
        raise UserError(f"{what}: a question id appears twice")
    if features.shape[0] < 20:
        raise UserError(f"{what}: {features.shape[0]} questions; fit a probe on at least 20")


def fit_probe(kind: str, features: np.ndarray, target: Sequence[float], question_ids: Sequence[str], *, model: str,
              layers: Sequence[int], positions: Sequence[str], target_name: str, seed: int = 0, folds: int = 5,
              grid: Sequence[float] | None = None) -> Probe:
    """Fit a probe of `kind` on these questions (for an accuracy probe: its fit split alone, `target` the errors;
    for an entropy probe: any questions, `target` their semantic entropy), regularisation chosen on the same
    questions: `folds`-fold cross-validated log loss (accuracy), efficient leave-one-out error (entropy)."""
    import sklearn
    from sklearn.linear_model import LogisticRegression, RidgeCV

    y = np.asarray(target, dtype=np.float64)
    _checked(np.asarray(features), y, question_ids, f"probe {kind}")
    x, mean, scale = _standardised(features)
    if kind == "accuracy":
        if set(np.unique(y)) - {0.0, 1.0} or np.unique(y).size < 2:
            raise UserError("probe accuracy: errors must be 0/1 with both present in the fit split")
        chosen = _best_c(x, y.astype(int), grid or LOGISTIC_CS, folds, seed)
        fitted = LogisticRegression(C=chosen, max_iter=1000).fit(x, y.astype(int))
        coef, intercept = fitted.coef_[0], float(fitted.intercept_[0])
    elif kind == "semantic_entropy":
        fitted = RidgeCV(alphas=list(grid or RIDGE_ALPHAS)).fit(x, y)  # efficient leave-one-out
        coef, intercept, chosen = fitted.coef_, float(fitted.intercept_), float(fitted.alpha_)
    else:
        raise UserError(f"probe kind = {kind!r}: use {' or '.join(KINDS)}")
    return Probe(kind, model, tuple(layers), tuple(positions), target_name, tuple(map(str, question_ids)),
                 tuple(mean.tolist()), tuple(scale.tolist()), tuple(np.asarray(coef).tolist()), intercept, chosen,
                 fitted_with=sklearn.__version__)


def _best_c(x: np.ndarray, y: np.ndarray, grid: Sequence[float], folds: int, seed: int) -> float:
    """The inverse L2 strength with the smallest cross-validated log loss (stratified folds, seeded)."""
    if np.bincount(y).min() < 2:
        raise UserError("probe accuracy: the fit split needs at least 2 right and 2 wrong answers")
    if len(grid) == 1:
        return float(grid[0])
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.model_selection import StratifiedKFold

    splits = list(StratifiedKFold(n_splits=min(folds, int(np.bincount(y).min())), shuffle=True,
                                  random_state=seed).split(x, y))
    losses = [sum(log_loss(y[test], LogisticRegression(C=c, max_iter=1000).fit(x[train], y[train])
                           .predict_proba(x[test])[:, 1], labels=[0, 1]) for train, test in splits)
              for c in grid]
    return float(grid[int(np.argmin(losses))])
