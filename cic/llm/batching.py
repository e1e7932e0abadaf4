"""How many rows a forward pass can take: from the model's shape and the memory its device has free.

A decoding row costs its key/value cache (2 · layers · kv heads · head dim · bytes per value, per token held)
plus the float32 logits work of one step (a few copies of the vocabulary); a prefill row costs its prompt's
activations. The budget is a share of the free memory measured before each chunk, so batches grow when memory
frees up and shrink when it does not; an out-of-memory error halves the share, and it recovers step by step
after chunks that fit. On CPU the rows are also capped: past a few hundred rows a CPU step only gets slower
per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOGITS_COPIES = 4  # logits, log-softmax, tempered copy, candidate scores
ACTIVATION_COPIES = 6  # hidden states live at once during a prefill layer (residual, norms, q/k/v, MLP)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a causal LM that set its memory per row."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    bytes_per_value: int

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """Read from a transformers model's config (and its parameter dtype)."""
        config = model.config
        config = getattr(config, "text_config", None) or config
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
        value_bytes = next(model.parameters()).element_size()
        return cls(layers=int(config.num_hidden_layers), kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
                   intermediate=intermediate, vocab=int(config.vocab_size), bytes_per_value=value_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value

    def decode_row_bytes(self, tokens: int) -> int:
        """Memory of one decoding row holding `tokens` positions of cache."""
        return self.kv_bytes_per_token * tokens + LOGITS_COPIES * 4 * self.vocab

    def prefill_row_bytes(self, prompt_tokens: int) -> int:
        """Memory of one prompt during its prefill (activations of one layer, its cache, last logits)."""
        per_token = ACTIVATION_COPIES * max(self.hidden, self.intermediate) * self.bytes_per_value
        return prompt_tokens * (per_token + self.kv_bytes_per_token) + 4 * self.vocab


def free_bytes(device: str) -> int:
    """Free memory on `device`: for CUDA the driver's free bytes plus what PyTorch's caching allocator holds
    reserved but unused (after a large chunk the allocator keeps its blocks, and the driver alone would report
    them taken, shrinking every later chunk); the host's available RAM for CPU."""
    if str(device).startswith("cuda"):
        import torch

        where = torch.device(device)
        cached = torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)
        return int(torch.cuda.mem_get_info(where)[0] + max(0, cached))
    import psutil

    return int(psutil.virtual_memory().available)


class BatchSizer:
    """Rows per forward pass from free memory; `fixed_rows` (a user's batch_size) caps it instead."""

    def __init__(self, shape: ModelShape, device: str, *, fixed_rows: int | None = None, share: float = 0.8,
                 cpu_max_rows: int = 256, gpu_max_rows: int = 4096) -> None:
        self.shape, self.device = shape, str(device)
        self.max_share = share
        self.share = share
        self.max_rows = gpu_max_rows if self.device.startswith("cuda") else cpu_max_rows
        if fixed_rows is not None:
            self.max_rows = fixed_rows
        self.base_max_rows = self.max_rows

    def budget(self) -> int:
        return int(free_bytes(self.device) * self.share)

    def questions_per_chunk(self, prompt_lengths: list[int], rows_per_question: int, new_tokens: int) -> int:
        """How many of these prompts (taken in order) to decode together, at least one."""
        budget, count, longest = self.budget(), 0, 0
        for length in prompt_lengths:
            longest = max(longest, length)
            rows = (count + 1) * rows_per_question
            decode = rows * self.shape.decode_row_bytes(longest + new_tokens)
            prefill = (count + 1) * self.shape.prefill_row_bytes(longest)
            if count and (rows > self.max_rows or max(decode, prefill) > budget):
                break
            count += 1
        return max(1, count)

    def prompts_per_forward(self, prompt_lengths: list[int]) -> int:
        """How many prompts (one row each) to prefill together: the multiple-choice path."""
        return self.questions_per_chunk(prompt_lengths, 1, 0)

    def out_of_memory(self) -> bool:
        """Halve the share after an OOM; False when already at one row (nothing left to shrink)."""
        if self.max_rows <= 1:
            return False
        self.share /= 2
        self.max_rows = max(1, self.max_rows // 2)
        return True

    def fitted(self) -> None:
        """A chunk fit: let the share recover a step towards its starting value."""
        self.share = min(self.max_share, self.share * 1.25)
        self.max_rows = min(self.base_max_rows, max(self.max_rows + 1, int(self.max_rows * 1.25)))
