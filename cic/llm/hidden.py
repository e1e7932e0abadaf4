"""Hidden states kept from the greedy pass (`generation.keep_hidden: [layers]`), for learned scores (probes).

The local engine already computes every layer's hidden state while it answers; with `keep_hidden` it keeps a few
layers at two positions of the most likely answer's pass — the last prompt token (what the model knows before it
answers) and the last answer token it fed back (what it knows having answered; the prompt's again for an empty
answer, and the option pass's for multiple choice, whose answer is read from that one distribution) — at no extra
forward pass. They are stored as float16 bytes in the greedy row's `hidden` column (`[position, layer, width]`,
C order), null on sampled rows and where nothing was kept.

Layers index the model's `hidden_states` tuple: 0 is the embeddings, 1..L the blocks' outputs, -1 the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cic.errors import UserError

POSITIONS = ("prompt", "answer")  # the first axis of a kept block
MAX_LAYERS = 8  # a kept block is 2 x layers x width float16: 8 layers of a 4096-wide model is 128 KiB a question


def check_layers(layers: Sequence[int], n_layers: int | None = None) -> tuple[int, ...]:
    """`keep_hidden` as given: distinct integers, at most MAX_LAYERS; with `n_layers` (the model's blocks), each
    resolved to its index in `hidden_states` (0..n_layers), a layer the model lacks refused in one line."""
    chosen = tuple(layers)
    if any(isinstance(x, bool) or not isinstance(x, int) for x in chosen):
        raise UserError(f"keep_hidden = {list(chosen)!r}: layers are integers (0 embeddings, -1 the last block)")
    if len(chosen) > MAX_LAYERS or len(set(chosen)) != len(chosen):
        raise UserError(f"keep_hidden = {list(chosen)!r}: at most {MAX_LAYERS} distinct layers")
    if n_layers is None:
        return chosen
    resolved = tuple(x + n_layers + 1 if x < 0 else x for x in chosen)
    bad = [x for x, r in zip(chosen, resolved, strict=True) if not 0 <= r <= n_layers]
    if bad:
        raise UserError(f"keep_hidden = {list(chosen)!r}: layer {bad[0]} is not in this model (0..{n_layers}, or "
                        f"-{n_layers + 1}..-1)")
    if len(set(resolved)) != len(resolved):
        raise UserError(f"keep_hidden = {list(chosen)!r}: two entries name the same layer of this model")
    return resolved


def at_position(hidden_states: Sequence[Any], layers: Sequence[int], position: int = -1) -> Any:
    """The kept layers' states at one sequence position: a tensor [rows, layers, width]."""
    import torch

    return torch.stack([hidden_states[layer][:, position, :] for layer in layers], dim=1)


def pack(prompt: Any, answer: Any) -> bytes:
    """One question's block ([layers, width] at each position) as float16 bytes."""
    return np.stack([np.asarray(prompt, dtype=np.float16), np.asarray(answer, dtype=np.float16)]).tobytes()


def unpack(blob: bytes, n_layers: int) -> np.ndarray:
    """A stored block back as float16 [2, n_layers, width]."""
    values = np.frombuffer(blob, dtype=np.float16)
    width, rest = divmod(values.size, 2 * n_layers)
    if rest or not width:
        raise UserError(f"hidden state of {len(blob)} bytes does not hold 2 x {n_layers} layers")
    return values.reshape(2, n_layers, width)


def feature_matrix(blobs: Sequence[bytes | None], n_layers: int, positions: Sequence[str] = POSITIONS
                   ) -> np.ndarray:
    """Rows of float32 features (the chosen positions' kept layers, concatenated) for a probe to read; a question
    without a kept block is refused by name of its position in `blobs`."""
    missing = [i for i, blob in enumerate(blobs) if blob is None]
    if missing:
        raise UserError(f"{len(missing)} question(s) have no kept hidden state (first: row {missing[0]}); "
                        "generate them with generation.keep_hidden")
    unknown = [p for p in positions if p not in POSITIONS]
    if unknown:
        raise UserError(f"position = {unknown[0]!r}: use {' or '.join(POSITIONS)}")
    index = [POSITIONS.index(p) for p in positions]
    return np.stack([unpack(blob, n_layers)[index].reshape(-1) for blob in blobs]).astype(np.float32)  # type: ignore[arg-type]
