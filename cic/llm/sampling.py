"""Token sampling that stays on the model's device and draws counter-based noise.

Each draw inverts the cumulative distribution of the tokens that survive temperature, top-k and nucleus
(top-p) filtering, taken in a fixed order (descending logit, or token id when nothing is filtered), at a
uniform U computed by hashing (row key, step). A row's key comes from (seed, question id, sample index), so
its noise does not depend on which rows share its batch, on the device, or on the order questions run in: a
resumed run draws the same answers as the run it resumes (up to the model's own kernel differences across
batch shapes). One uniform per row and step is enough for an exact draw and costs nothing next to the
filtering (`uniforms` can also hash a token id, for per-token noise).

Nucleus filtering looks at the `candidates` largest logits first and sorts only those; a row whose
candidates hold less than top_p of the mass (a flat distribution) falls back to a sort of its whole
vocabulary, so the kept set is always exactly the smallest prefix reaching top_p. With 16-bit logits (a bf16 or
fp16 model's own output) ties are ordered by token id and the fallback counts equal values instead of sorting
(`nucleus_bins`): the same draw, a fraction of the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cic import schema
from cic.llm import nucleus_bins

MASK32 = 0xFFFFFFFF
DEFAULT_CANDIDATES = 1024


def row_key(seed: int, question_id: str, sample_index: int) -> tuple[int, int]:
    """Two 32-bit words identifying one (seed, question, sample) row: the counter base of its noise."""
    digest = int(schema.stable_hash(str(seed), str(question_id), str(sample_index)), 16)
    return digest & MASK32, (digest >> 32) & MASK32


def row_keys(seed: int, question_ids: Sequence[str], n_rows: int, device: Any = "cpu") -> Any:
    """int64 [len(question_ids) × n_rows, 2] keys, rows of a question consecutive in sample order."""
    import torch

    keys = [row_key(seed, q, s) for q in question_ids for s in range(n_rows)]
    return torch.tensor(keys, dtype=torch.int64, device=device).view(-1, 2)


def _mul32(x: Any, constant: int) -> Any:
    """(x · constant) mod 2³² for x in [0, 2³²) held in int64, without signed overflow (16-bit halves)."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def mix32(x: Any) -> Any:
    """A bijective 32-bit integer hash (Wellons' lowbias32) on an int64 tensor of values in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(keys: Any, step: int, token_ids: Any) -> Any:
    """float32 uniforms in (0, 1), one per (row, token): a pure function of (key, step, token id).

    keys: int64 [rows, 2]; token_ids: int64 [rows, n] (or [n], shared by every row); [rows, 1] of zeros
    gives the one uniform per row that `sample` uses.
    """
    per_row = mix32(keys[:, 1:2] ^ mix32(keys[:, 0:1] ^ mix32(keys.new_tensor(step & MASK32))))
    bits = mix32(mix32(per_row ^ (token_ids & MASK32)))
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def inverse_cdf(weights: Any, u: Any) -> Any:
    """Index per row where the running sum of `weights` [rows, n] first exceeds u · total (u [rows, 1])."""
    import torch

    cumulative = weights.cumsum(-1)
    picks = torch.searchsorted(cumulative, u * cumulative[:, -1:], right=True)
    return picks.clamp(max=weights.shape[-1] - 1)


def nucleus_mask(sorted_scaled: Any, top_p: float, total_logsumexp: Any) -> Any:
    """True where a token (logits sorted descending, tempered) belongs to the top-p nucleus.

    A token is kept when the mass of the tokens before it is below top_p: the smallest prefix reaching top_p.
    `total_logsumexp` [rows, 1] normalises over the whole vocabulary, not only the sorted slice.
    """
    import torch

    probs = torch.exp(sorted_scaled - total_logsumexp)
    before = probs.cumsum(-1) - probs
    return before < top_p


def filtered_weights(logits: Any, temperature: float, top_k: int, top_p: float,
                     candidates: int = DEFAULT_CANDIDATES) -> list[tuple[Any, Any, Any]]:
    """Each row's kept tokens and their unnormalised weights, as (rows, token ids, weights) groups.

    The first group covers every row (rows None); a second group, when present, replaces the rows whose
    `candidates` largest logits hold less than top_p of the mass, sorted over the whole vocabulary. Equivalent
    to filtering the whole vocabulary: top-k keeps the k largest, top-p the smallest prefix of the (top-k-
    restricted, renormalised) distribution whose mass reaches top_p; weights are zero outside the kept set.
    """
    import torch

    scaled = logits.float() / temperature
    vocab = scaled.shape[-1]
    if top_k == 0 and top_p >= 1.0:
        ids = torch.arange(vocab, device=scaled.device).expand(scaled.shape[0], vocab)
        return [(None, ids, torch.softmax(scaled, dim=-1))]
    width = min(vocab, top_k) if top_k else min(vocab, candidates)
    values, ids = torch.topk(scaled, width, dim=-1, sorted=True)
    if top_p >= 1.0:
        return [(None, ids, torch.softmax(values, dim=-1))]
    total = torch.logsumexp(values if top_k else scaled, dim=-1, keepdim=True)
    groups = [(None, ids, torch.exp(values - total) * nucleus_mask(values, top_p, total))]
    if not top_k and width < vocab:
        covered = torch.exp(torch.logsumexp(values, dim=-1) - total[:, 0]) >= top_p
        if not bool(covered.all()):  # flat rows: their nucleus may reach past the candidates
            flat = (~covered).nonzero()[:, 0]
            full_values, full_ids = torch.sort(scaled[flat], dim=-1, descending=True)
            keep = nucleus_mask(full_values, top_p, total[flat])
            groups.append((flat, full_ids, torch.exp(full_values - total[flat]) * keep))
    return groups


def sample(logits: Any, keys: Any, step: int, *, temperature: float, top_k: int = 0, top_p: float = 1.0,
           candidates: int = DEFAULT_CANDIDATES) -> Any:
    """One token id per row drawn from the filtered distribution at a counter-based uniform (inverse CDF)."""
    return sample_counting(logits, keys, step, temperature=temperature, top_k=top_k, top_p=top_p,
                           candidates=candidates)[0]


def sample_counting(logits: Any, keys: Any, step: int, *, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    candidates: int = DEFAULT_CANDIDATES) -> tuple[Any, int]:
    """`sample`, plus how many rows needed a whole-vocabulary sort (to adapt `candidates`)."""
    import torch

    u = uniforms(keys, step, torch.zeros_like(keys[:, :1]))
    if nucleus_bins.handles(logits, top_k, top_p):
        return _sample_16bit(logits, u, temperature, top_p, candidates)[:2]
    chosen, flat_rows = None, 0
    for rows, ids, weights in filtered_weights(logits, temperature, top_k, top_p, candidates):
        picks = ids.gather(-1, inverse_cdf(weights, u if rows is None else u[rows]))[:, 0]
        if rows is None:
            chosen = picks
        else:
            chosen[rows] = picks
            flat_rows = len(rows)
    return chosen, flat_rows


def _sample_16bit(logits: Any, u: Any, temperature: float, top_p: float,
                  candidates: int) -> tuple[Any, int, Any]:
    """Top-p draws on 16-bit logits: the `candidates` largest in (value, token id) order where they cover the
    nucleus, value counting (`nucleus_bins`) for the rows where they do not, or for all when candidates span
    the vocabulary. A row counts as covered only by candidates above the smallest candidate value, so a tie
    cut by top-k never decides the nucleus. Also returns logsumexp(logits / T) per row (float32 [rows])."""
    import torch

    if candidates >= logits.shape[-1]:
        chosen, log_normaliser = nucleus_bins.draw_normalised(logits, u, temperature, top_p)
        return chosen, 0, log_normaliser
    _, ids = torch.topk(logits, candidates, dim=-1, sorted=False)
    ids = ids.sort(dim=-1).values
    values, order = logits.gather(-1, ids).sort(dim=-1, descending=True, stable=True)
    ids, values = ids.gather(-1, order), values.float() / temperature
    total = torch.logsumexp(logits.float() / temperature, dim=-1, keepdim=True)
    chosen = ids.gather(-1, inverse_cdf(torch.exp(values - total) * nucleus_mask(values, top_p, total), u))[:, 0]
    above = torch.where(values > values[:, -1:], values, -torch.inf)
    covered = torch.exp(torch.logsumexp(above, dim=-1) - total[:, 0]) >= top_p
    if bool(covered.all()):
        return chosen, 0, total[:, 0]
    flat = (~covered).nonzero()[:, 0]
    chosen[flat] = nucleus_bins.draw(logits[flat], u[flat], temperature, top_p)
    return chosen, len(flat), total[:, 0]


class AdaptiveSampler:
    """`sample` with the candidate width chosen from the previous step: when most rows were flat (their top
    candidates held less than top_p), sort whole vocabularies at once instead of a top-k then a fallback sort;
    every few steps it tries the narrow path again. The draws are the same either way (exact filtering).
    On 16-bit logits it keeps the step's logsumexp(logits / T) in `log_normaliser` (None otherwise), which a
    caller at temperature 1 can use for log-probabilities instead of another pass over the vocabulary."""

    def __init__(self, temperature: float, top_k: int, top_p: float, retry_every: int = 8) -> None:
        self.temperature, self.top_k, self.top_p, self.retry_every = temperature, top_k, top_p, retry_every
        self.wide_since: int | None = None
        self.log_normaliser: Any = None

    def __call__(self, logits: Any, keys: Any, step: int) -> Any:
        import torch

        wide = self.wide_since is not None and step - self.wide_since < self.retry_every
        candidates = logits.shape[-1] if wide else DEFAULT_CANDIDATES
        self.log_normaliser = None
        if nucleus_bins.handles(logits, self.top_k, self.top_p):
            u = uniforms(keys, step, torch.zeros_like(keys[:, :1]))
            chosen, flat_rows, self.log_normaliser = _sample_16bit(logits, u, self.temperature, self.top_p,
                                                                   candidates)
        else:
            chosen, flat_rows = sample_counting(logits, keys, step, temperature=self.temperature, top_k=self.top_k,
                                                top_p=self.top_p, candidates=candidates)
        if not wide:
            self.wide_since = step if flat_rows * 2 > logits.shape[0] else None
        return chosen


def kept_distribution(logits: Any, temperature: float, top_k: int, top_p: float,
                      candidates: int = DEFAULT_CANDIDATES) -> Any:
    """The distribution `sample` draws from, over the whole vocabulary [rows, vocab] (for checks)."""
    import torch

    if nucleus_bins.handles(logits, top_k, top_p):
        return nucleus_bins.kept_distribution(logits, temperature, top_p)
    out = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
    for rows, ids, weights in filtered_weights(logits, temperature, top_k, top_p, candidates):
        dense = torch.zeros(ids.shape[0], logits.shape[-1], dtype=torch.float64, device=logits.device)
        dense.scatter_(-1, ids, weights.double())
        dense /= dense.sum(-1, keepdim=True)
        if rows is None:
            out = dense
        else:
            out[rows] = dense
    return out
