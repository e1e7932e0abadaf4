"""Batch sizing from a model's shape and free memory: grows with memory, shrinks on OOM, recovers."""

from __future__ import annotations

import pytest

from cic.llm import batching
from cic.llm.batching import BatchSizer, ModelShape

# a Llama-3-8B-like shape in bf16: 128 KiB of key/value cache per token
SHAPE = ModelShape(layers=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336, vocab=128256,
                   bytes_per_value=2)


def test_kv_cache_bytes_follow_the_config() -> None:
    assert SHAPE.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert SHAPE.decode_row_bytes(100) == 100 * 131072 + 4 * 4 * 128256


def test_shape_is_read_from_a_transformers_config() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=500)
    shape = ModelShape.of(LlamaForCausalLM(config))
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.vocab, shape.bytes_per_value) == (3, 2, 16, 500, 4)


def test_chunks_grow_with_free_memory_and_shrink_on_oom(monkeypatch: pytest.MonkeyPatch) -> None:
    free = {"bytes": 8 * 2**30}
    monkeypatch.setattr(batching, "free_bytes", lambda device: free["bytes"])
    sizer = BatchSizer(SHAPE, "cuda:0")
    prompts = [60] * 1000
    small = sizer.questions_per_chunk(prompts, 11, 32)
    free["bytes"] = 64 * 2**30
    large = sizer.questions_per_chunk(prompts, 11, 32)
    assert 1 < small < large  # 8 GiB → about 40 questions of 11 rows; 64 GiB → about 320
    assert large * 11 * SHAPE.decode_row_bytes(92) <= 0.8 * 64 * 2**30
    assert sizer.out_of_memory()
    assert sizer.questions_per_chunk(prompts, 11, 32) <= large // 2 + 1
    for _ in range(20):
        sizer.fitted()
    assert sizer.questions_per_chunk(prompts, 11, 32) == large


def test_long_prompts_make_smaller_chunks_and_one_question_always_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "free_bytes", lambda device: 4 * 2**30)
    sizer = BatchSizer(SHAPE, "cuda:0")
    assert sizer.questions_per_chunk([2000] * 50, 11, 32) < sizer.questions_per_chunk([100] * 50, 11, 32)
    assert sizer.questions_per_chunk([100_000], 11, 32) == 1


def test_cpu_caps_rows_and_a_fixed_batch_size_caps_them_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "free_bytes", lambda device: 200 * 2**30)
    assert BatchSizer(SHAPE, "cpu").questions_per_chunk([60] * 100, 11, 16) == 256 // 11
    assert BatchSizer(SHAPE, "cpu", fixed_rows=22).questions_per_chunk([60] * 100, 11, 16) == 2
    assert BatchSizer(SHAPE, "cpu", fixed_rows=22).prompts_per_forward([60] * 100) == 22


def test_out_of_memory_at_one_row_gives_up() -> None:
    sizer = BatchSizer(SHAPE, "cpu", fixed_rows=1)
    assert not sizer.out_of_memory()


def test_cuda_free_memory_counts_what_the_allocator_holds_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a large chunk PyTorch keeps its blocks reserved: the driver reports them taken, but the next chunk can
    reuse them, so they count as free (else every chunk after the first shrinks to what the driver has left)."""
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 60 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 15 * 2**30)
    assert batching.free_bytes("cuda:0") == (5 + 60 - 15) * 2**30
    sizer = BatchSizer(SHAPE, "cuda:0")
    assert sizer.questions_per_chunk([60] * 1000, 11, 32) > 200  # about 40 GiB of budget, not 4
