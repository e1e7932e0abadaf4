"""Answers and their log-probabilities: a most-likely answer plus K samples per question, or option letters.

Open-ended questions: each question's prompt is encoded once (prefill, left-padded across questions), its
key/value cache is repeated for the 1 + K rows of that question, and one decode loop advances every row on the
model's device: sampling (`cic.llm.sampling`: inverse CDF at a counter-based uniform keyed by seed,
question id, sample index and step), stop tokens, finished rows, token ids and log-probabilities all stay device
tensors; the host reads a single flag every few steps (to stop when every row is done) and the results once
per chunk. A row stops at end-of-sequence or at a token that contains a newline. Token log-probabilities are
those of the model itself (log-softmax of the untempered logits); the stop token is not part of the answer.
Chunks are sized from free device memory (`cic.llm.batching`).

Multiple choice: one forward pass gives the next-token distribution; each option's probability is the mass
of its letter tokens ("A" and " A"), renormalised over the options. Sample 0 is the arg-max letter and
samples 1..K are draws from that distribution with the same counter-based noise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cic import schema
from cic.errors import UserError

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.kept_prefill import Encoded
    from cic.llm.models import LoadedModel

log = logging.getLogger("cic.generation")

SAMPLER = "counter-cdf-v1"  # how noise is drawn: part of the run key, since it shapes the rows
MIN_SHARED_PREFIX = 16  # tokens: a shorter common prefix is not worth a separate forward pass


@dataclass(frozen=True)
class GenerationConfig:
    """How answers are produced (every field but batch_size shapes the rows and enters the run key)."""

    n_samples: int = 10
    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int = 0
    most_likely_temperature: float = 0.0
    max_new_tokens: int = 32
    stop_at_newline: bool = True
    seed: int = 0
    batch_size: int | None = None
    max_context_tokens: int | None = None
    adaptive: tuple[int, ...] | None = None  # rounds of the adaptive rule (cic.llm.uncertainty.adaptive); None: at once
    keep_hidden: tuple[int, ...] = ()  # layers whose states the greedy pass keeps (cic.llm.hidden); () keeps none

    def __post_init__(self) -> None:
        checks = [("n_samples", self.n_samples >= 1), ("temperature", self.temperature > 0),
                  ("top_p", 0 < self.top_p <= 1), ("top_k", self.top_k >= 0),
                  ("most_likely_temperature", self.most_likely_temperature >= 0),
                  ("max_new_tokens", self.max_new_tokens >= 1),
                  ("batch_size", self.batch_size is None or self.batch_size >= 1),
                  ("max_context_tokens", self.max_context_tokens is None or self.max_context_tokens >= 8)]
        for name, ok in checks:
            if not ok:
                raise UserError(f"{name} = {getattr(self, name)!r}: out of range")
        if self.adaptive is not None:
            from cic.llm.uncertainty.adaptive import checked_rounds

            try:
                rounds = checked_rounds(self.adaptive)
            except ValueError as exc:
                raise UserError(f"adaptive: {exc}") from None
            if rounds[-1] != self.n_samples:
                raise UserError(f"adaptive = {list(rounds)}: its last round draws {rounds[-1]} samples, "
                                f"n_samples = {self.n_samples}; make them equal")
            object.__setattr__(self, "adaptive", rounds)
        from cic.llm.hidden import check_layers

        object.__setattr__(self, "keep_hidden", check_layers(self.keep_hidden))

    def shaping(self) -> dict[str, Any]:
        """The fields that shape the generated rows (for the store's run key)."""
        values = asdict(self)
        values.pop("batch_size")
        if self.adaptive is None:  # absent, not null: runs keyed before adaptive rounds existed keep their keys
            values.pop("adaptive")
        else:
            values["adaptive"] = list(self.adaptive)
        if self.keep_hidden:  # stored rows gain a column: a run that keeps states is its own run
            values["keep_hidden"] = list(self.keep_hidden)
        else:
            values.pop("keep_hidden")
        values["sampler"] = SAMPLER
        return values


class AnswerGenerator:
    """Generates GENERATIONS rows for batches of prompts with one loaded model."""

    def __init__(self, loaded: LoadedModel, config: GenerationConfig) -> None:
        from cic.llm.batching import BatchSizer, ModelShape

        self.loaded = loaded
        self.config = config
        tokenizer = loaded.tokenizer
        self.eos_ids = {i for i in (tokenizer.eos_token_id, getattr(loaded.model.generation_config,
                                                                        "eos_token_id", None)) if i is not None
                        and not isinstance(i, list)}
        eos_list = getattr(loaded.model.generation_config, "eos_token_id", None)
        if isinstance(eos_list, list):
            self.eos_ids |= set(eos_list)
        self.stop_ids = set(self.eos_ids)
        if config.stop_at_newline:
            vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            self.stop_ids |= {i for i, t in enumerate(vocab) if t is not None and
                              ("\n" in tokenizer.convert_tokens_to_string([t]) or t in ("Ċ", "<0x0A>"))}
        self.n_forward_calls = 0
        self._forward_events: list[Any] = []
        self._cpu_forward_s = 0.0
        self.sizer = BatchSizer(ModelShape.of(loaded.model), loaded.device, fixed_rows=config.batch_size)
        self.sync_every = 4 if str(loaded.device).startswith("cuda") else 1
        self._stop_mask: Any = None
        self.step_model: Any = loaded.model  # runs the one-token decode steps; a benchmark may swap in a compiled one
        self.chunk_sizes: list[int] = []  # items per chunk of the last call (for benchmarks and logs)
        self._encoded_prompts: list[Encoded] = []  # adaptive rounds: the first round's prefills, reused by the later
        self.prefills_reused = 0  # chunks of later rounds decoded from a kept prefill (for benchmarks and tests)
        self._letter_cache: dict[str, list[int]] = {}
        from cic.llm.hidden import check_layers

        blocks = getattr(getattr(loaded.model.config, "get_text_config", lambda: loaded.model.config)(),
                         "num_hidden_layers", None)
        self.kept_layers = check_layers(config.keep_hidden, blocks) if config.keep_hidden else ()
        self._prompt_states: Any = None  # the last prefill's kept layers at each prompt's last token [n, k, d]

    # -- prompts ---------------------------------------------------------------------------------------------

    def _encode(self, prompts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids per prompt, left-truncated to fit the context (flagged)."""
        limit = (self.config.max_context_tokens or self.loaded.context_length) - self.config.max_new_tokens
        encoded, truncated = [], []
        for prompt in prompts:
            ids = self.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if not ids:
                raise UserError("prompt is empty after tokenisation")
            cut = len(ids) > limit
            if cut:
                log.warning("prompt of %d tokens truncated to the last %d (context %d)", len(ids), limit,
                            self.loaded.context_length)
                ids = ids[-limit:]
            encoded.append(ids)
            truncated.append(cut)
        return encoded, truncated

    def _padded(self, encoded: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        import torch

        width = max(len(ids) for ids in encoded)
        pad = self.loaded.tokenizer.pad_token_id
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            mask[row, width - len(ids):] = 1
        return input_ids.to(self.loaded.device), mask.to(self.loaded.device)

    def _timed(self, step: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one forward pass, adding its time to `forward_s`: GPU time between two CUDA events (no host sync,
        so the host keeps queueing work ahead of the GPU), wall time on a CPU."""
        import time

        import torch

        self.n_forward_calls += 1
        if str(self.loaded.device).startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = step(*args, **kwargs)
            end.record()
            self._forward_events.append((start, end))
            return out
        started = time.perf_counter()
        out = step(*args, **kwargs)
        self._cpu_forward_s += time.perf_counter() - started
        return out

    @property
    def forward_s(self) -> float:
        """Seconds spent in the model's forward passes since the last reset (for benchmarks)."""
        pending, self._forward_events = self._forward_events, []
        self._cpu_forward_s += sum(start.elapsed_time(end) for start, end in pending) / 1000
        return self._cpu_forward_s

    @forward_s.setter
    def forward_s(self, value: float) -> None:
        self._forward_events, self._cpu_forward_s = [], value

    def _forward(self, model: Any = None, **inputs: Any) -> Any:
        import torch

        if self.kept_layers:  # the states are computed anyway: ask for them back (keep_hidden)
            inputs["output_hidden_states"] = True

        def run() -> Any:
            with torch.inference_mode():
                return (self.loaded.model if model is None else model)(**inputs, use_cache=True, logits_to_keep=1)
        return self._timed(run)

    def _prefill(self, encoded: Sequence[Sequence[int]], room: int = 0) -> tuple[Any, Any, Any, Any]:
        """Encode prompts: last-position logits [n, vocab] (the model's dtype), the KV cache, attention mask, last
        positions.

        Prompts that share a leading run of tokens (a few-shot prefix, a chat template) have it encoded once and
        its cache repeated: [shared prefix][left padding][own suffix], padding masked, positions continuous.
        With `room` > 0 the cache is preallocated (transformers' StaticCache) for that many more positions, so
        decoding writes into it in place instead of concatenating every layer's keys and values each step.
        """
        import os

        import torch
        from transformers import DynamicCache, StaticCache

        widest = max(map(len, encoded))
        shared = min(len(os.path.commonprefix([list(ids) for ids in encoded])), min(map(len, encoded)) - 1)
        if len(encoded) < 2 or shared < MIN_SHARED_PREFIX:
            shared = 0
        cache = (StaticCache(config=self.loaded.model.config, max_cache_len=widest + room) if room
                 else DynamicCache(config=self.loaded.model.config))
        device = self.loaded.device
        if shared:
            prefix = torch.tensor([list(encoded[0][:shared])], dtype=torch.long, device=device)
            self._forward(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                          position_ids=torch.arange(shared, device=device)[None], past_key_values=cache)
            self._repeat_cache(cache, len(encoded))
        suffix_ids, suffix_mask = self._padded([ids[shared:] for ids in encoded])
        positions = (shared + suffix_mask.cumsum(-1) - 1).clamp(min=shared)
        mask = torch.cat([torch.ones((len(encoded), shared), dtype=suffix_mask.dtype, device=device), suffix_mask],
                         dim=1)
        out = self._forward(input_ids=suffix_ids, attention_mask=self._cache_mask(mask, cache),
                            position_ids=positions, past_key_values=cache)
        if self.kept_layers:  # left padding: position -1 is every prompt's last token
            from cic.llm.hidden import at_position

            self._prompt_states = at_position(out.hidden_states, self.kept_layers)
        return out.logits[:, -1, :], cache, mask, positions[:, -1:]

    @staticmethod
    def _repeat_cache(cache: Any, repeats: int) -> None:
        """Repeat every cached sequence `repeats` times in place (consecutive copies), growing or preallocated."""
        for layer in cache.layers:
            if hasattr(layer, "batch_repeat_interleave"):
                layer.batch_repeat_interleave(repeats)
            elif getattr(layer, "is_initialized", False):  # a preallocated layer: its tensors, then its batch size
                layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
                layer.values = layer.values.repeat_interleave(repeats, dim=0)
                layer.batch_size = layer.keys.shape[0]

    @staticmethod
    def _cache_mask(mask: Any, cache: Any) -> Any:
        """The attention mask as the cache wants it: padded with zeros to a preallocated cache's length."""
        import torch

        capacity = cache.get_max_length()  # -1 for a growing cache
        if capacity <= mask.shape[1]:
            return mask
        return torch.nn.functional.pad(mask, (0, capacity - mask.shape[1]))

    def _stop_tokens(self, vocab: int) -> Any:
        """Boolean [vocab] device tensor: True for end-of-sequence and (optionally) newline tokens."""
        import torch

        if self._stop_mask is None or self._stop_mask.shape[0] != vocab:
            mask = torch.zeros(vocab, dtype=torch.bool)
            ids = [i for i in self.stop_ids if 0 <= i < vocab]
            if ids:
                mask[torch.tensor(ids)] = True
            self._stop_mask = mask.to(self.loaded.device)
        return self._stop_mask

    def _in_chunks(self, work: Any, n_items: int, chunk_size: Any) -> list[Any]:
        """Run `work(start, stop)` over consecutive chunks sized by `chunk_size(start)`, halving on OOM."""
        import torch

        results, start = [], 0
        self.chunk_sizes = []
        while start < n_items:
            stop = min(n_items, start + chunk_size(start))
            try:
                results.append(work(start, stop))
            except (RuntimeError, MemoryError) as exc:
                oom = isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
                if not oom or stop - start == 1:  # a single question that does not fit cannot shrink further
                    raise
                self.sizer.out_of_memory()
                log.warning("out of memory at %d questions per chunk: at most %d rows per forward pass now",
                            stop - start, self.sizer.max_rows)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            self.sizer.fitted()
            self.chunk_sizes.append(stop - start)
            start = stop
        return results

    # -- open-ended ------------------------------------------------------------------------------------------

    def _choose(self, sampler: Any, logits: Any, keys: Any, step: int, most_likely: Any) -> Any:
        """Next token per row: samples for sample rows, arg-max (or tempered draw) for most-likely rows."""
        import torch

        from cic.llm.sampling import sample

        cfg = self.config
        chosen = sampler(logits, keys, step)
        if cfg.most_likely_temperature > 0:
            rows = most_likely.nonzero()[:, 0]
            chosen[rows] = sample(logits[rows], keys[rows], step, temperature=cfg.most_likely_temperature)
            return chosen
        return torch.where(most_likely, logits.argmax(-1), chosen)

    def _log_normaliser(self, sampler: Any, logits: Any) -> Any:
        """logsumexp of each row's untempered logits (float32): the sampler's own at temperature 1, else computed."""
        import torch

        if self.config.temperature == 1.0 and sampler.log_normaliser is not None:
            return sampler.log_normaliser
        return torch.logsumexp(logits.float(), dim=-1)

    def _decode_chunk(self, encoded: Sequence[Sequence[int]], question_ids: Sequence[str],
                      indices: Sequence[int]) -> list[list[dict]]:
        """The rows `indices` (0: the most-likely answer, s ≥ 1: sample s) of a few questions sharing one prefill;
        rows per question in the order of `indices`. A row's noise is keyed by its own index, so a round that draws
        samples 3-4 draws what a run drawing 1-10 at once drew as its samples 3-4."""
        import torch

        from cic.llm.sampling import AdaptiveSampler, row_key

        cfg, n_rows, device = self.config, len(indices), self.loaded.device
        sampler = AdaptiveSampler(cfg.temperature, cfg.top_k, cfg.top_p)
        logits, cache, mask, last_pos = self._prefilled(encoded, question_ids, indices)
        keep = bool(self.kept_layers) and 0 in indices
        states = self._prompt_states.repeat_interleave(n_rows, dim=0) if keep else None
        self._repeat_cache(cache, n_rows)
        logits = logits.repeat_interleave(n_rows, dim=0)
        mask = mask.repeat_interleave(n_rows, dim=0)
        last_pos = last_pos.repeat_interleave(n_rows, dim=0)
        rows, width = len(encoded) * n_rows, cfg.max_new_tokens
        keys = torch.tensor([row_key(cfg.seed, q, s) for q in question_ids for s in indices], dtype=torch.int64,
                            device=device).view(-1, 2)
        most_likely = torch.tensor([s == 0 for s in indices], device=device).repeat(len(encoded))
        stop_mask = self._stop_tokens(logits.shape[-1])
        pad = self.loaded.tokenizer.pad_token_id
        tokens = torch.full((rows, width), pad, dtype=torch.long, device=device)
        logprobs = torch.zeros((rows, width), dtype=torch.float32, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        for step in range(width):
            chosen = self._choose(sampler, logits, keys, step, most_likely)
            token_logit = logits.gather(-1, chosen[:, None])[:, 0].float()
            token_logprob = token_logit - self._log_normaliser(sampler, logits)
            is_stop = stop_mask[chosen]
            stopped |= ~finished & is_stop
            finished |= is_stop
            live = ~finished
            tokens[:, step] = torch.where(live, chosen, pad)
            logprobs[:, step] = torch.where(live, token_logprob, 0.0)
            lengths += live
            if step == width - 1 or (step + 1) % self.sync_every == 0 and bool(finished.all()):
                break
            mask = torch.cat([mask, live[:, None].to(mask.dtype)], dim=1)
            last_pos = last_pos + 1
            out = self._forward(self.step_model, input_ids=torch.where(live, chosen, pad)[:, None],
                                attention_mask=self._cache_mask(mask, cache), position_ids=last_pos,
                                past_key_values=cache)
            logits = out.logits[:, -1, :]
            if keep:  # a row fed a token of its answer now holds that token's state
                from cic.llm.hidden import at_position

                states = torch.where(live[:, None, None], at_position(out.hidden_states, self.kept_layers), states)
        host_tokens, host_logprobs = tokens.cpu().tolist(), logprobs.cpu().tolist()
        host_lengths, host_stopped = lengths.cpu().tolist(), stopped.cpu().tolist()
        results = []
        for qi in range(len(encoded)):
            per_question = []
            for s in range(n_rows):
                r, n = qi * n_rows + s, host_lengths[qi * n_rows + s]
                per_question.append({"tokens": host_tokens[r][:n], "logprobs": host_logprobs[r][:n],
                                     "stopped": host_stopped[r], "hidden": self._kept(states, qi, r)
                                     if keep and indices[s] == 0 else None})
            results.append(per_question)
        return results
    def _kept(self, states: Any, question: int, row: int) -> bytes:
        """One greedy row's kept block: its prompt's last-token states and those of the last answer token fed."""
        from cic.llm.hidden import pack

        return pack(self._prompt_states[question].float().cpu().numpy(), states[row].float().cpu().numpy())

    def _prefilled(self, encoded: Sequence[Sequence[int]], question_ids: Sequence[str],
                   indices: Sequence[int]) -> tuple[Any, Any, Any, Any]:
        """The prefill of these prompts: a later adaptive round (no row 0) takes its questions' rows of the one the
        first round kept, instead of encoding the prompts again; a first round (row 0 asked by index) keeps its own.
        A plain call (every row) keeps nothing."""
        keyed = [(str(q), tuple(ids)) for q, ids in zip(question_ids, encoded, strict=True)]
        if 0 not in indices:
            for kept in self._encoded_prompts:
                if set(keyed) <= kept.rows.keys():
                    self.prefills_reused += 1
                    return kept.select([kept.rows[k] for k in keyed])
        logits, cache, mask, last_pos = self._prefill(encoded, room=self.config.max_new_tokens)
        if 0 in indices and len(indices) < self.config.n_samples + 1:
            from cic.llm.kept_prefill import Encoded

            self._encoded_prompts.append(Encoded.keep(keyed, logits, cache, mask, last_pos))
        return logits, cache, mask, last_pos

    def _text(self, token_ids: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[str], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        """Most-likely answer (sample_index 0) plus n_samples samples per question, as GENERATIONS rows; `indices`:
        only those rows (an adaptive round: `cic.llm.uncertainty.adaptive.round_indices`)."""
        import polars as pl

        if len(question_ids) != len(prompts):
            raise ValueError(f"question_ids ({len(question_ids)}) and prompts ({len(prompts)}) differ in length")
        indices = list(range(self.config.n_samples + 1)) if indices is None else list(indices)
        if 0 in indices:  # a new batch: the prefills an earlier batch's first round kept are not needed again
            self._encoded_prompts = []
        encoded, truncated = self._encode(prompts)
        lengths = [len(ids) for ids in encoded]
        n_rows = len(indices)

        def chunk_size(start: int) -> int:
            return self.sizer.questions_per_chunk(lengths[start:], n_rows, self.config.max_new_tokens)

        def decode(start: int, stop: int) -> list[dict[str, Any]]:
            chunk = self._decode_chunk(encoded[start:stop], question_ids[start:stop], indices)
            return [self._record(run_key, question_ids[start + offset], indices[s], row, truncated[start + offset])
                    for offset, rows in enumerate(chunk) for s, row in enumerate(rows)]

        records = [r for part in self._in_chunks(decode, len(prompts), chunk_size) for r in part]
        return schema.conform(pl.DataFrame(records, schema=schema.GENERATIONS.schema), schema.GENERATIONS)

    def _record(self, run_key: str, question_id: str, sample_index: int, row: dict, truncated: bool) -> dict:
        text = self._text(row["tokens"])
        flags = []
        if not text:
            flags.append("empty")
        if truncated:
            flags.append("prompt_truncated")
        if not row["stopped"]:
            flags.append("max_tokens")
        n = len(row["tokens"])
        total = float(sum(row["logprobs"]))
        return {"run_key": run_key, "question_id": str(question_id), "sample_index": sample_index, "text": text,
                "n_tokens": n, "logprob_sum": total, "logprob_mean": total / n if n else None,
                "is_greedy": sample_index == 0, "option_probs": None, "flags": flags, "hidden": row.get("hidden")}

    # -- multiple choice -------------------------------------------------------------------------------------

    def _letter_ids(self, label: str) -> list[int]:
        """First token ids of the letter as it may follow the prompt: "A" and " A"."""
        if label not in self._letter_cache:
            ids = set()
            for variant in (label, f" {label}"):
                tokens = self.loaded.tokenizer(variant, add_special_tokens=False)["input_ids"]
                if tokens:
                    ids.add(tokens[0])
            self._letter_cache[label] = sorted(ids)
        return self._letter_cache[label]

    def _option_probs(self, next_token_probs: Any, labels: Sequence[str], question_id: str) -> np.ndarray:
        """Each option's share of the next-token mass on its letter tokens (uniform if none has any)."""
        if not labels:
            raise UserError(f"question_id {question_id!r}: choice_labels is empty")
        mass = np.array([float(next_token_probs[self._letter_ids(lab)].sum()) for lab in labels])
        return mass / mass.sum() if mass.sum() > 0 else np.full(len(labels), 1 / len(labels))

    def _option_draws(self, option_probs: np.ndarray, question_id: str) -> list[int]:
        """n_samples draws of an option index, noise keyed like the open-ended rows' first step."""
        import torch

        from cic.llm.sampling import inverse_cdf, row_keys, uniforms

        keys = row_keys(self.config.seed, [question_id], self.config.n_samples + 1)[1:]
        weights = torch.tensor(option_probs, dtype=torch.float64).expand(len(keys), -1)
        return inverse_cdf(weights, uniforms(keys, 0, torch.zeros_like(keys[:, :1])).double())[:, 0].tolist()

    def choose(self, question_ids: Sequence[str], prompts: Sequence[str], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        """Option-letter distribution per question; arg-max letter plus n_samples draws, as GENERATIONS rows."""
        import polars as pl
        import torch

        from cic.llm.hidden import pack

        if not len(question_ids) == len(prompts) == len(choice_labels):
            raise ValueError("question_ids, prompts and choice_labels differ in length")
        encoded, truncated = self._encode(prompts)
        lengths = [len(ids) for ids in encoded]

        def score(start: int, stop: int) -> list[dict[str, Any]]:
            logits = self._prefill(encoded[start:stop])[0]
            probs_all = torch.softmax(logits.float(), dim=-1).cpu()
            kept = self._prompt_states.float().cpu().numpy() if self.kept_layers else None
            records = []
            for offset in range(stop - start):
                qi = start + offset
                labels = list(choice_labels[qi])
                option_probs = self._option_probs(probs_all[offset], labels, question_ids[qi])
                picks = [int(np.argmax(option_probs))] + self._option_draws(option_probs, question_ids[qi])
                for s, pick in enumerate(picks):
                    logprob = math.log(max(option_probs[pick], 1e-300))
                    records.append({
                        "run_key": run_key, "question_id": str(question_ids[qi]), "sample_index": s,
                        "text": labels[pick], "n_tokens": 1, "logprob_sum": logprob, "logprob_mean": logprob,
                        "is_greedy": s == 0, "option_probs": option_probs.tolist(),
                        "flags": ["prompt_truncated"] if truncated[qi] else [],
                        "hidden": pack(kept[offset], kept[offset]) if kept is not None and s == 0 else None})
            return records

        def chunk_size(start: int) -> int:
            return self.sizer.prompts_per_forward(lengths[start:])

        records = [r for part in self._in_chunks(score, len(prompts), chunk_size) for r in part]
        return schema.conform(pl.DataFrame(records, schema=schema.GENERATIONS.schema), schema.GENERATIONS)


def generate_for_questions(generator: AnswerGenerator, questions: pl.DataFrame, prompts: Sequence[str], *,
                           run_key: str, open_rows: Any = None) -> pl.DataFrame:
    """GENERATIONS rows for a QUESTIONS frame: option letters where `choices` is set, free text otherwise
    (`open_rows(ids, prompts)`, the generator's `generate_open` unless given: adaptive rounds)."""
    import polars as pl

    if questions.height != len(prompts):
        raise ValueError(f"{questions.height} questions but {len(prompts)} prompts")
    is_mc = questions.get_column("choices").is_not_null().to_list()
    ids = questions.get_column("question_id").to_list()
    labels = questions.get_column("choice_labels").to_list()
    parts = []
    mc = [i for i, m in enumerate(is_mc) if m]
    open_ = [i for i, m in enumerate(is_mc) if not m]
    if mc:
        parts.append(generator.choose([ids[i] for i in mc], [prompts[i] for i in mc], [labels[i] for i in mc],
                                      run_key=run_key))
    if open_:
        draw = open_rows or (lambda i, p: generator.generate_open(i, p, run_key=run_key))
        parts.append(draw([ids[i] for i in open_], [prompts[i] for i in open_]))
    if not parts:
        return pl.DataFrame(schema=schema.GENERATIONS.schema)
    return pl.concat(parts)
