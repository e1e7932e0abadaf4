"""One decode step of a causal LM over a preallocated cache, replayed as a CUDA graph on a GPU.

With transformers' StaticCache every decode step has the same shapes and tensor addresses (the cache writes at
its own device-side length), so the step's few hundred kernel launches can be captured once per chunk and
replayed: the host no longer paces the GPU. The step reads its inputs from fixed buffers — token ids, positions
and a ready 4-D boolean attention mask (which the model uses as given, so no mask is built on the host). The
first step runs eagerly (it also warms up the kernels), the second is captured, every later one replays it.
On a CPU, or when capture fails, every step runs eagerly on the same buffers: the same numbers either way.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("cic.generation")


class DecodeStep:
    """Callable `(token_ids [rows], positions [rows, 1], mask [rows, capacity]) -> last-position logits`."""

    def __init__(self, model: Any, cache: Any, rows: int, capacity: int, device: Any, graph: bool) -> None:
        import torch

        self.model, self.cache = model, cache
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.mask = torch.zeros((rows, 1, 1, capacity), dtype=torch.bool, device=device)
        self.use_graph = graph and str(device).startswith("cuda")
        self.graph: Any = None
        self.logits: Any = None
        self.steps = 0

    def _run(self) -> Any:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions,
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def _capture(self) -> None:
        """Record one step into a CUDA graph (nothing runs while recording, so the cache does not advance)."""
        import torch

        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.logits = self._run()
        except RuntimeError as exc:  # an operation that cannot be captured: keep stepping eagerly
            log.warning("decode step not captured as a CUDA graph (%s): stepping eagerly", str(exc).splitlines()[0])
            self.use_graph, self.logits = False, None
            return
        self.graph = graph

    def __call__(self, token_ids: Any, positions: Any, mask: Any) -> Any:
        self.ids.copy_(token_ids[:, None])
        self.positions.copy_(positions)
        self.mask.copy_(mask[:, None, None, :].bool())
        self.steps += 1
        if self.use_graph and self.steps >= 2:
            if self.graph is None:
                self._capture()
            if self.graph is not None:
                self.graph.replay()
                return self.logits
        return self._run()
