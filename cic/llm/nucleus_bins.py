"""Top-p draws over 16-bit logits by counting equal values instead of sorting the vocabulary.

A bf16 or fp16 logit takes one of at most 65,536 values, so a row's descending order is fully described by how
many of its tokens hold each value: every token of one value has the same probability. Counting tokens per value
(one scatter pass), then working on the few thousand occupied values (a cumulative sum, the nucleus cut, the
inverse-CDF draw) and finally finding the chosen value's j-th token gives the same draw as sorting the whole
vocabulary in descending order with ties in token-id order — without the sort, which on a flat
(random-weight) distribution over 128k tokens dominated a GPU decode step. Bin arithmetic is in float64.
"""

from __future__ import annotations

from typing import Any

SIXTEEN_BIT = ("bfloat16", "float16")
SLICE_ELEMENTS = 1 << 27  # rows are counted in slices of at most this many logits (bounds the int64 index copy)
_VALUE_TABLES: dict[tuple[str, str], Any] = {}


def handles(logits: Any, top_k: int, top_p: float) -> bool:
    """Whether this path draws for these settings: 16-bit logits, top-p filtering, no top-k."""
    return str(logits.dtype).removeprefix("torch.") in SIXTEEN_BIT and top_k == 0 and top_p < 1.0


def descending_bins(logits: Any) -> Any:
    """int32 [rows, vocab]: 0 for the largest value a 16-bit logit can hold, rising as the value falls.

    The IEEE bit pattern is sign-magnitude: flipping a negative pattern's magnitude bits makes it order like a
    two's-complement integer. Adding +0 first turns −0 into +0, so equal values share a bin.
    """
    import torch

    key = (logits + 0.0).view(torch.int16)
    key = key ^ ((key >> 15) & 0x7FFF)
    return 0x7FFF - key.to(torch.int32)


def bin_values(dtype: Any, device: Any) -> Any:
    """float64 [65536]: the value of each descending bin (NaN patterns read as −inf: they carry no mass)."""
    import torch

    key = (str(dtype), str(device))
    if key not in _VALUE_TABLES:
        order = 0x7FFF - torch.arange(1 << 16, dtype=torch.int32)
        bits = torch.where(order >= 0, order, order ^ 0x7FFF).to(torch.int16)
        values = bits.view(dtype).double()
        _VALUE_TABLES[key] = torch.nan_to_num(values, nan=-torch.inf).to(device)
    return _VALUE_TABLES[key]


def _count(bins: Any, lo: int, width: int) -> Any:
    """int32 [rows, width]: tokens of each row in each bin lo … lo + width − 1, counted in row slices."""
    import torch

    rows, vocab = bins.shape
    counts = torch.zeros((rows, width), dtype=torch.int32, device=bins.device)
    step = max(1, SLICE_ELEMENTS // max(vocab, 1))
    for start in range(0, rows, step):
        part = bins[start:start + step]
        ones = torch.ones((1, 1), dtype=torch.int32, device=bins.device).expand(part.shape)
        counts[start:start + step].scatter_add_(1, (part - lo).long(), ones)
    return counts


def nucleus(logits: Any, temperature: float, top_p: float) -> tuple[Any, Any, Any, int, Any]:
    """Per row and occupied bin: (tokens kept, probability of one token) as float64 [rows, width], the int32
    descending bins [rows, vocab], the first bin's index and each row's logsumexp(logits / T) [rows, 1]. A bin's
    tokens are kept in token-id order while the mass before them is below top_p: the smallest prefix of the
    sorted vocabulary reaching top_p."""
    import torch

    bins = descending_bins(logits)
    lo, hi = (int(end) for end in torch.aminmax(bins))
    counts = _count(bins, lo, hi - lo + 1).double()
    values = bin_values(logits.dtype, logits.device)[lo:hi + 1] / temperature
    top = torch.where(counts > 0, values, -torch.inf).amax(-1, keepdim=True)
    weight = torch.exp(values - top)
    normaliser = (counts * weight).sum(-1, keepdim=True)
    p_token = weight / normaliser
    mass = counts * p_token
    before = mass.cumsum(-1) - mass
    room = torch.where(p_token > 0, (top_p - before) / p_token, torch.inf)
    kept = torch.where(before < top_p, torch.minimum(room.ceil(), counts), 0.0)
    return kept, p_token, bins, lo, top + torch.log(normaliser)


def draw(logits: Any, u: Any, temperature: float, top_p: float) -> Any:
    """One token id per row [rows], drawn at uniform u [rows, 1] by inverse CDF over the nucleus."""
    return draw_normalised(logits, u, temperature, top_p)[0]


def draw_normalised(logits: Any, u: Any, temperature: float, top_p: float) -> tuple[Any, Any]:
    """`draw`, plus each row's logsumexp(logits / T) as float32 [rows] (counted in float64, so free here)."""
    import torch

    kept, p_token, bins, lo, log_normaliser = nucleus(logits, temperature, top_p)
    kept_mass = kept * p_token
    cumulative = kept_mass.cumsum(-1)
    target = u.double() * cumulative[:, -1:]
    last = kept.shape[1] - 1 - (kept > 0).flip(-1).int().argmax(-1, keepdim=True)
    chosen_bin = torch.minimum(torch.searchsorted(cumulative, target, right=True), last)
    start = cumulative.gather(-1, chosen_bin) - kept_mass.gather(-1, chosen_bin)
    within = ((target - start) / p_token.gather(-1, chosen_bin)).floor()
    within = torch.minimum(within.clamp(min=0), kept.gather(-1, chosen_bin) - 1).long()
    rank = (bins == (chosen_bin + lo).to(torch.int32)).cumsum(-1, dtype=torch.int32)  # tokens of its value so far
    tokens = torch.searchsorted(rank, (within + 1).to(torch.int32))[:, 0]  # where the (within + 1)-th one stands
    return tokens, log_normaliser[:, 0].float()


def kept_distribution(logits: Any, temperature: float, top_p: float) -> Any:
    """float64 [rows, vocab]: the distribution `draw` samples from (for checks; ranks ties by a stable sort)."""
    import torch

    kept, p_token, bins, lo, _ = nucleus(logits, temperature, top_p)
    local = (bins - lo).long()
    order = torch.sort(local, dim=-1, stable=True).indices
    counts_before = torch.zeros_like(kept).long()
    sizes = torch.zeros_like(kept).long().scatter_add_(1, local, torch.ones_like(local))
    counts_before[:, 1:] = sizes.cumsum(-1)[:, :-1]
    rank = torch.empty_like(local)
    positions = torch.arange(local.shape[1], device=local.device).expand_as(local)
    rank.scatter_(1, order, positions - counts_before.gather(-1, local.gather(-1, order)))
    keep = rank < kept.gather(-1, local)
    dense = torch.where(keep, p_token.gather(-1, local), 0.0)
    return dense / dense.sum(-1, keepdim=True)
