"""Probes on kept hidden states: the fit split drawn by hash alone, fitted probes that score held-out questions,
an artifact that reads back to the same scores, and the refusal that keeps a probe's certificate valid — a
simulation shows fitting on the calibration questions breaks the guarantee and the disjoint split keeps it."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.llm.probes import Probe, fit_probe, fit_split, ids_digest


def _world(rng: np.random.Generator, n: int, p: int = 200, signal: float = 1.5) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states with a weak linear signal of being wrong in a few of their p directions."""
    x = rng.normal(size=(n, p))
    w = np.zeros(p)
    w[:5] = signal / np.sqrt(5)
    errors = (rng.random(n) < 1 / (1 + np.exp(-(x @ w - 0.4)))).astype(int)
    return x, errors


def _fit(x: np.ndarray, errors: np.ndarray, ids: list[str], **kw: object) -> Probe:
    return fit_probe("accuracy", x, errors, ids, model="m", layers=(-1,), positions=("answer",),
                     target_name="exact_match", **kw)


def test_the_fit_split_is_drawn_from_ids_alone() -> None:
    ids = [f"q{i}" for i in range(4000)]
    chosen = fit_split(ids, share=0.3, seed=0)
    assert 0.27 < len(chosen) / len(ids) < 0.33
    assert fit_split(list(reversed(ids)), 0.3, 0) == list(reversed(chosen))  # order does not matter
    assert set(fit_split(ids[:100], 0.3, 0)) == set(chosen) & set(ids[:100])  # nor which others are there
    assert fit_split(ids, 0.3, seed=1) != chosen
    with pytest.raises(UserError, match="fit_share = 1.0: must be in"):
        fit_split(ids, 1.0)
    assert ids_digest(["b", "a", "a"]) == ids_digest(["a", "b"]) != ids_digest(["a"])


def test_an_accuracy_probe_ranks_held_out_questions_and_reads_back_identically() -> None:
    rng = np.random.default_rng(0)
    x, e = _world(rng, 1200, p=50)
    ids = [f"q{i}" for i in range(1200)]
    probe = _fit(x[:600], e[:600], ids[:600], grid=(0.01, 1.0))  # the cross-validated choice of two
    held = probe.score(x[600:])
    assert ((held > 0) & (held < 1)).all()
    wrong, right = held[e[600:] == 1], held[e[600:] == 0]
    auc = (wrong[:, None] > right[None, :]).mean()
    assert auc > 0.7
    again = Probe.from_json(probe.to_json())
    assert np.array_equal(again.score(x[600:]), held) and again.estimator == probe.estimator
    assert probe.estimator == f"probe_accuracy[exact_match:{ids_digest(ids[:600])}]"
    with pytest.raises(UserError, match=r"features of shape \(3, 4\), expected \(n, 50\)"):
        probe.score(np.zeros((3, 4)))
    with pytest.raises(UserError, match="not a CIC probe artifact"):
        Probe.from_json("{not json")
    with pytest.raises(UserError, match="probe artifact version 7"):
        Probe.from_json('{"version": 7}')


def test_a_calibration_over_fit_split_questions_is_refused_in_one_line() -> None:
    rng = np.random.default_rng(1)
    x, e = _world(rng, 100, p=10)
    ids = [f"q{i}" for i in range(100)]
    probe = _fit(x[:60], e[:60], ids[:60], grid=(1.0,))
    probe.check_disjoint(ids[60:], "calibration")
    with pytest.raises(UserError) as info:
        probe.check_disjoint(ids[50:], "calibration of qwen · trivia_qa")
    text = str(info.value)
    assert "\n" not in text and text.startswith("calibration of qwen · trivia_qa: 10 question(s) that probe "
                                                "probe_accuracy[exact_match:") and "(first: q50)" in text
    entropy = fit_probe("semantic_entropy", x, rng.random(100), ids, model="m", layers=(-1,),
                        positions=("prompt",), target_name="semantic_entropy")
    entropy.check_disjoint(ids, "calibration")  # label-free: it may score the questions it was fitted on


def test_an_entropy_probe_recovers_a_linear_entropy() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(800, 30))
    entropy = x[:, 0] - 0.5 * x[:, 1] + 0.1 * rng.normal(size=800)
    ids = [str(i) for i in range(800)]
    probe = fit_probe("semantic_entropy", x[:400], entropy[:400], ids[:400], model="m", layers=(-1,),
                      positions=("prompt",), target_name="semantic_entropy")
    assert np.corrcoef(probe.score(x[400:]), entropy[400:])[0, 1] > 0.95


@pytest.mark.slow  # 30 draws of two fits each: evidence; the refusal itself is pinned by the fast tests
def test_fitting_on_the_calibration_questions_breaks_the_guarantee_and_the_disjoint_split_keeps_it() -> None:
    """The issue's validity target: over many draws, how often does the certified threshold's error rate on fresh
    questions exceed alpha? A probe fitted on the calibration questions themselves scores its own mistakes as
    certain, certifies far more than it should, and violates far more often than delta; fitted on a disjoint fit
    split (what `check_disjoint` enforces) it stays within delta."""
    alpha, delta, trials = 0.25, 0.05, 30
    rng = np.random.default_rng(3)
    violations = {"fitted on calibration": 0, "disjoint fit split": 0}
    for _ in range(trials):
        x, e = _world(rng, 600 + 20000, p=200)
        fit_x, fit_e, cal_x, cal_e, test_x, test_e = x[:300], e[:300], x[300:600], e[300:600], x[600:], e[600:]
        cal_ids = [f"c{i}" for i in range(300)]
        arms = {"fitted on calibration": _fit(cal_x, cal_e, cal_ids, grid=(10.0,)),
                "disjoint fit split": _fit(fit_x, fit_e, [f"f{i}" for i in range(300)], grid=(10.0,))}
        for arm, probe in arms.items():
            result = cic.calibrate(probe.score(cal_x), cal_e, alpha=alpha, delta=delta, search="fixed_sequence")
            if result.threshold is not None:
                accepted = probe.score(test_x) <= result.threshold
                violations[arm] += int(test_e[accepted].mean() > alpha) if accepted.any() else 0
        with pytest.raises(UserError, match="300 question"):
            arms["fitted on calibration"].check_disjoint(cal_ids, "calibration")
    assert violations["fitted on calibration"] / trials > 0.5, violations
    assert violations["disjoint fit split"] / trials <= delta + 0.05, violations
