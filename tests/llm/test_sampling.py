"""Device-side sampling: counter-based noise, filtering against a direct reference, draw frequencies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from cic.llm import sampling

LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0, 0.9]])


def lowbias32(x: int) -> int:
    """The published hash in plain Python integers."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def numpy_reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, top-k, then the smallest prefix of the renormalised distribution reaching top_p."""
    z = logits / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros(len(p), dtype=bool)
    keep[order[before < top_p]] = True
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def test_mix32_is_lowbias32_without_overflow() -> None:
    rng = np.random.default_rng(0)
    values = [0, 1, 0xFFFFFFFF, 0x80000000, *rng.integers(0, 2**32, 200).tolist()]
    got = sampling.mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [lowbias32(v) for v in values]


def test_noise_is_a_pure_function_of_key_step_and_token() -> None:
    keys = sampling.row_keys(7, ["q1", "q2", "q3"], 4)
    tokens = torch.arange(50).expand(12, 50)
    together = sampling.uniforms(keys, 3, tokens)
    alone = sampling.uniforms(keys[5:6], 3, tokens[5:6])
    assert torch.equal(together[5:6], alone)
    assert not torch.equal(together[4], together[5])                          # rows differ
    assert not torch.equal(together, sampling.uniforms(keys, 4, tokens))      # steps differ
    assert sampling.row_key(7, "q2", 1) == tuple(keys[5].tolist())
    assert sampling.row_key(8, "q2", 1) != sampling.row_key(7, "q2", 1)


def test_uniforms_are_uniform() -> None:
    keys = sampling.row_keys(0, [str(i) for i in range(100)], 10)
    u = sampling.uniforms(keys, 0, torch.arange(1000).expand(1000, 1000)).flatten().numpy()
    assert 0 < u.min() and u.max() < 1
    counts, _ = np.histogram(u, bins=100, range=(0, 1))
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(float(np.corrcoef(u[:-1], u[1:])[0, 1])) < 0.01  # neighbouring tokens independent


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(1.0, 0, 1.0), (1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 3, 1.0), (1.0, 4, 0.8), (2.0, 0, 0.95)])
@pytest.mark.parametrize("candidates", [2, 1024])  # 2 forces the whole-vocabulary fallback for top-p
def test_filtering_matches_a_direct_reference(temperature: float, top_k: int, top_p: float, candidates: int) -> None:
    kept = sampling.kept_distribution(LOGITS, temperature, top_k, top_p, candidates=candidates)[0].numpy()
    expected = numpy_reference(LOGITS[0].double().numpy(), temperature, top_k, top_p)
    assert kept == pytest.approx(expected, abs=1e-6)


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = sampling.kept_distribution(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0, 0.75)
    assert probs[0].tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 0.9), (0.8, 3, 1.0)])
def test_draw_frequencies_match_the_filtered_distribution(temperature: float, top_k: int, top_p: float) -> None:
    rows = 20_000
    keys = sampling.row_keys(1, [str(i) for i in range(rows)], 1)
    draws = sampling.sample(LOGITS.expand(rows, -1), keys, 0, temperature=temperature, top_k=top_k, top_p=top_p)
    expected = numpy_reference(LOGITS[0].double().numpy(), temperature, top_k, top_p)
    counts = np.bincount(draws.numpy(), minlength=LOGITS.shape[1])
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    assert stats.chisquare(counts[support], expected[support] * rows).pvalue > 1e-3


def test_a_flat_row_falls_back_exactly_and_a_peaked_row_does_not() -> None:
    flat = torch.zeros(1, 5000)
    peaked = torch.full((1, 5000), -20.0)
    peaked[0, :3] = torch.tensor([3.0, 2.0, 1.0])
    groups = sampling.filtered_weights(torch.cat([peaked, flat]), 1.0, 0, 0.9, candidates=64)
    assert len(groups) == 2 and groups[1][0].tolist() == [1]          # only the flat row is sorted in full
    assert int((groups[1][2] > 0).sum()) == 4500                       # it keeps 90% of its 5,000 tokens
    kept = sampling.kept_distribution(torch.cat([peaked, flat]), 1.0, 0, 0.9, candidates=64)
    assert set(kept[0].nonzero()[:, 0].tolist()) == {0, 1}              # 0.665 + 0.245 reaches 0.9
    assert len(sampling.filtered_weights(peaked, 1.0, 0, 0.9, candidates=64)) == 1
    keys = sampling.row_keys(0, [str(i) for i in range(4000)], 1)
    draws = sampling.sample(flat.expand(4000, -1), keys, 0, temperature=1.0, top_p=0.9, candidates=64)
    assert int(draws.max()) >= 4400 and len(set(draws.tolist())) > 2000  # beyond the candidates, spread out


def test_the_adaptive_sampler_draws_what_sample_draws_on_flat_and_peaked_steps() -> None:
    generator = torch.Generator().manual_seed(0)
    keys = sampling.row_keys(3, [str(i) for i in range(40)], 1)
    adaptive = sampling.AdaptiveSampler(1.0, 0, 0.9)
    widened = []
    for step in range(24):
        scale = 0.01 if step < 12 else 8.0  # flat steps (every row falls back), then peaked ones
        logits = torch.randn(40, 3000, generator=generator) * scale
        expected = sampling.sample(logits, keys, step, temperature=1.0, top_p=0.9, candidates=1024)
        assert torch.equal(adaptive(logits, keys, step), expected)
        widened.append(adaptive.wide_since is not None)
    assert any(widened[:12]) and not widened[-1]
