"""The decode step on fixed buffers (4-D mask, preallocated cache) computes what the model computes from a 2-D mask."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from cic.llm.decode_step import DecodeStep


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def prefilled(model: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor, room: int) -> StaticCache:
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + room)
    full = torch.nn.functional.pad(mask, (0, room))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=full, position_ids=positions, past_key_values=cache, use_cache=True)
    return cache


def test_steps_match_the_model_with_a_two_dimensional_mask() -> None:
    model = tiny_llama()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # the first row left-padded
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    room = 3
    reference, ours = prefilled(model, ids, mask, room), prefilled(model, ids, mask, room)
    step = DecodeStep(model, ours, rows=2, capacity=ids.shape[1] + room, device="cpu", graph=True)
    assert not step.use_graph  # no CUDA graph on a CPU: every step eager on the same buffers
    positions = (mask.cumsum(-1) - 1)[:, -1:]
    for token in (11, 12, 13):
        mask = torch.cat([mask, torch.ones((2, 1), dtype=mask.dtype)], dim=1)
        positions = positions + 1
        tokens = torch.full((2,), token)
        padded = torch.nn.functional.pad(mask, (0, ids.shape[1] + room - mask.shape[1]))
        with torch.inference_mode():
            expected = model(input_ids=tokens[:, None], attention_mask=padded, position_ids=positions,
                             past_key_values=reference, use_cache=True).logits[:, -1, :]
        got = step(tokens, positions, padded)
        assert torch.allclose(got, expected, atol=1e-5), (token, (got - expected).abs().max())
    assert step.steps == 3
