"""Top-p by counting 16-bit values: the same kept set and the same draws as a stable descending sort."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cic.llm import nucleus_bins, sampling


def reference(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float) -> tuple[list, np.ndarray]:
    """Per row: the inverse-CDF draw over a stable descending sort (ties in token-id order), and the kept
    distribution — float64 NumPy, one token at a time, no binning."""
    draws, dense = [], np.zeros(logits.shape)
    for r, row in enumerate(logits.double().numpy() / temperature):
        p = np.exp(row - row.max())
        p /= p.sum()
        order = np.argsort(-row, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        weights = np.where(before < top_p, p[order], 0.0)
        cumulative = np.cumsum(weights)
        pick = min(int(np.searchsorted(cumulative, float(u[r, 0]) * cumulative[-1], side="right")), len(row) - 1)
        draws.append(int(order[pick]))
        dense[r, order] = weights / cumulative[-1]
    return draws, dense


def tied_logits(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """16-bit logits with many equal values: flat rows (random-weight-like), peaked rows, rounded rows."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.05, 0.5, 3.0, 8.0]).repeat(rows // 4 + 1)[:rows, None]
    logits = (torch.randn(rows, vocab, generator=generator) * scale).to(dtype)
    logits[::5] = (logits[::5].float() * 4).round().to(dtype) / 4  # a few values shared by hundreds of tokens
    return logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.9), (0.7, 0.5), (1.5, 0.95), (1.0, 0.01)])
def test_draws_and_kept_set_match_a_stable_sort(dtype: torch.dtype, temperature: float, top_p: float) -> None:
    logits = tied_logits(64, 3000, dtype)
    u = sampling.uniforms(sampling.row_keys(5, [str(i) for i in range(64)], 1), 3, torch.zeros(64, 1,
                                                                                               dtype=torch.long))
    expected_draws, expected_dense = reference(logits, u, temperature, top_p)
    assert nucleus_bins.draw(logits, u, temperature, top_p).tolist() == expected_draws
    kept = nucleus_bins.kept_distribution(logits, temperature, top_p).numpy()
    assert kept == pytest.approx(expected_dense, abs=1e-9)
    assert ((kept > 0) == (expected_dense > 0)).all()


def test_an_all_equal_row_keeps_the_first_tokens_by_id_and_zero_signs_tie() -> None:
    logits = torch.zeros(2, 1000, dtype=torch.bfloat16)
    logits[1, 1::2] = -0.0
    kept = nucleus_bins.kept_distribution(logits, 1.0, 0.9)
    assert kept[0].nonzero()[:, 0].tolist() == list(range(900))
    assert kept[1].nonzero()[:, 0].tolist() == list(range(900))  # −0 and +0 are one value, ordered by id
    u = torch.tensor([[0.0005], [0.9995]])
    assert nucleus_bins.draw(logits, u, 1.0, 0.9).tolist() == [0, 899]


def test_narrow_and_wide_paths_draw_alike_with_ties_at_the_candidate_boundary() -> None:
    logits = torch.full((3, 5000), -30.0)
    logits[:, :40] = 5.0   # 40 tied tokens hold nearly all the mass: 16 candidates cut the tie
    logits[1, :] = 0.0     # a flat row
    logits[2, 100:140] = 5.0
    logits = logits.to(torch.bfloat16)
    keys = sampling.row_keys(2, ["a", "b", "c"], 1)
    for step in range(30):
        narrow, flat_rows = sampling.sample_counting(logits, keys, step, temperature=1.0, top_p=0.9, candidates=16)
        wide = sampling.sample(logits, keys, step, temperature=1.0, top_p=0.9, candidates=5000)
        assert torch.equal(narrow, wide) and flat_rows == 3  # every row's nucleus reaches its candidates' tie
        assert int(narrow[0]) < 37 and int(narrow[1]) < 4500   # 36 × 0.025 − ε < 0.9: the first 37 of 40 tied


def test_peaked_rows_stay_on_the_narrow_path_and_agree_with_counting() -> None:
    logits = tied_logits(40, 4000, torch.bfloat16, seed=1)[2::4]  # scale 3: peaked enough for 64 candidates
    keys = sampling.row_keys(4, [str(i) for i in range(len(logits))], 1)
    for step in range(10):
        narrow, flat_rows = sampling.sample_counting(logits, keys, step, temperature=1.0, top_p=0.5, candidates=512)
        assert flat_rows == 0
        u = sampling.uniforms(keys, step, torch.zeros_like(keys[:, :1]))
        assert torch.equal(narrow, nucleus_bins.draw(logits, u, 1.0, 0.5))


def test_float32_logits_keep_the_sorting_path() -> None:
    assert not nucleus_bins.handles(torch.zeros(1, 4), 0, 0.9)
    assert not nucleus_bins.handles(torch.zeros(1, 4, dtype=torch.bfloat16), 5, 0.9)
    assert not nucleus_bins.handles(torch.zeros(1, 4, dtype=torch.bfloat16), 0, 1.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_adaptive_sampler_keeps_the_steps_logsumexp_on_both_paths(temperature: float) -> None:
    logits = torch.cat([tied_logits(8, 3000, torch.bfloat16, seed=2)[2::4],   # peaked: narrow path
                        torch.zeros(3, 3000, dtype=torch.bfloat16)])          # flat: counted
    keys = sampling.row_keys(6, [str(i) for i in range(len(logits))], 1)
    adaptive = sampling.AdaptiveSampler(temperature, 0, 0.9)
    expected = torch.logsumexp(logits.double() / temperature, dim=-1)
    for step in range(3):  # step 0 narrow with a fallback, then wide (most rows flat)
        adaptive(logits, keys, step)
        assert adaptive.log_normaliser.double() == pytest.approx(expected, abs=1e-5)
    assert adaptive.wide_since == 0
    assert sampling.AdaptiveSampler(1.0, 0, 0.9)(logits.float(), keys, 0) is not None
