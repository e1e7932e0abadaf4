"""A first adaptive round's prefill, kept for the later rounds (`cic.llm.generation.AnswerGenerator`): they decode
from their questions' rows of it instead of encoding the same prompts again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Encoded:
    """A first adaptive round's prefill of some prompts, kept unmutated (decoding writes into a copy): the last
    logits, the key/value cache, the attention mask and the last positions, one row per (question, prompt)."""

    rows: dict[tuple[str, tuple[int, ...]], int]
    logits: Any
    cache: Any
    mask: Any
    last_pos: Any

    @classmethod
    def keep(cls, keyed: Sequence[tuple[str, tuple[int, ...]]], logits: Any, cache: Any, mask: Any,
             last_pos: Any) -> Encoded:
        import copy

        return cls({k: i for i, k in enumerate(keyed)}, logits.clone(), copy.deepcopy(cache), mask.clone(),
                   last_pos.clone())

    def select(self, rows: Sequence[int]) -> tuple[Any, Any, Any, Any]:
        """Copies of these rows' prefill, ready to decode from (as if they alone had been encoded together)."""
        import copy

        import torch

        index = torch.tensor(list(rows), dtype=torch.long, device=self.logits.device)
        cache = copy.copy(self.cache)
        cache.layers = []
        for layer in self.cache.layers:
            own = copy.copy(layer)
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                own.keys, own.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
                if hasattr(own, "batch_size"):
                    own.batch_size = len(rows)
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    own.cumulative_length = layer.cumulative_length.clone()
            cache.layers.append(own)
        return self.logits[index], cache, self.mask[index], self.last_pos[index]
