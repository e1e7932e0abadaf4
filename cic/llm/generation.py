"""Answers and their log-probabilities: a most-likely answer plus K samples per question, or option letters.

Open-ended questions: each question's prompt is encoded once (prefill, left-padded across questions), its
key/value cache is repeated for the 1 + K rows of that question, and one decode loop advances every row,
stopping a row at end-of-sequence or at a token that contains a newline. Each row samples with its own
`torch.Generator` seeded from (seed, question id, sample index), so a question's rows do not depend on which
other questions share its batch — a resumed run reproduces a killed one. Token log-probabilities are those of
the model itself (log-softmax of the untempered logits) for the generated tokens; the stop token is not part
of the answer and not counted.

Multiple choice: one forward pass gives the next-token distribution; each option's probability is the mass
of its letter tokens ("A" and " A"), renormalised over the options. Sample 0 is the arg-max letter and
samples 1..K are drawn from that distribution.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cic import schema

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.models import LoadedModel

log = logging.getLogger("cic.generation")


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

    def __post_init__(self) -> None:
        checks = [("n_samples", self.n_samples >= 1), ("temperature", self.temperature > 0),
                  ("top_p", 0 < self.top_p <= 1), ("top_k", self.top_k >= 0),
                  ("most_likely_temperature", self.most_likely_temperature >= 0),
                  ("max_new_tokens", self.max_new_tokens >= 1),
                  ("batch_size", self.batch_size is None or self.batch_size >= 1),
                  ("max_context_tokens", self.max_context_tokens is None or self.max_context_tokens >= 8)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name} = {getattr(self, name)!r}: out of range")

    def shaping(self) -> dict[str, Any]:
        """The fields that shape the generated rows (for the store's run key)."""
        values = asdict(self)
        values.pop("batch_size")
        return values


def row_seed(seed: int, question_id: str, sample_index: int) -> int:
    """A 63-bit seed for one (question, sample): independent of batch composition and order."""
    return int(schema.stable_hash(str(seed), str(question_id), str(sample_index)), 16) & ((1 << 63) - 1)


def filter_logits(logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """Temperature, top-k and nucleus (top-p) filtering of a [rows, vocab] logit tensor → probabilities."""
    import torch

    scaled = logits / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(-1)
        drop = cumulative - sorted_probs > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class AnswerGenerator:
    """Generates GENERATIONS rows for batches of prompts with one loaded model."""

    def __init__(self, loaded: LoadedModel, config: GenerationConfig) -> None:
        self.loaded = loaded
        self.config = config
        tokenizer = loaded.tokenizer
        self.eos_ids = {i for i in (tokenizer.eos_token_id, getattr(loaded.model.generation_config,
                                                                        "eos_token_id", None)) if i is not None
                        and not isinstance(i, list)}
        eos_list = getattr(loaded.model.generation_config, "eos_token_id", None)
        if isinstance(eos_list, list):
            self.eos_ids |= set(eos_list)
        self.special_ids = set(tokenizer.all_special_ids)
        self.stop_ids = set(self.eos_ids)
        if config.stop_at_newline:
            vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            self.stop_ids |= {i for i, t in enumerate(vocab) if t is not None and
                              ("\n" in tokenizer.convert_tokens_to_string([t]) or t in ("Ċ", "<0x0A>"))}
        self.n_forward_calls = 0
        self._rows_per_forward = config.batch_size or 64

    # -- prompts ---------------------------------------------------------------------------------------------

    def _encode(self, prompts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids per prompt, left-truncated to fit the context (flagged)."""
        limit = (self.config.max_context_tokens or self.loaded.context_length) - self.config.max_new_tokens
        encoded, truncated = [], []
        for prompt in prompts:
            ids = self.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if not ids:
                raise ValueError("prompt is empty after tokenisation")
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

    def _forward(self, **inputs: Any) -> Any:
        import torch

        self.n_forward_calls += 1
        with torch.inference_mode():
            return self.loaded.model(**inputs, use_cache=True)

    # -- open-ended ------------------------------------------------------------------------------------------

    def _decode_chunk(self, encoded: Sequence[Sequence[int]], question_ids: Sequence[str]) -> list[list[dict]]:
        """Greedy + samples for a few questions sharing one prefill; rows per question in sample order."""
        import torch

        cfg, n_rows = self.config, self.config.n_samples + 1
        input_ids, mask = self._padded(encoded)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=positions)
        cache = out.past_key_values
        cache.batch_repeat_interleave(n_rows)
        logits = out.logits[:, -1, :].float().repeat_interleave(n_rows, dim=0)
        mask = mask.repeat_interleave(n_rows, dim=0)
        last_pos = positions[:, -1].repeat_interleave(n_rows, dim=0)
        rows = len(encoded) * n_rows
        generators = []
        for q in question_ids:
            for s in range(n_rows):
                g = torch.Generator(device="cpu")
                g.manual_seed(row_seed(cfg.seed, q, s))
                generators.append(g)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        done = [False] * rows
        stopped = [False] * rows
        pad = self.loaded.tokenizer.pad_token_id
        for step in range(cfg.max_new_tokens):
            log_probs = torch.log_softmax(logits, dim=-1)
            chosen = torch.empty(rows, dtype=torch.long)
            sample_probs = filter_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p).cpu()
            ml_probs = (filter_logits(logits, cfg.most_likely_temperature, 0, 1.0).cpu()
                        if cfg.most_likely_temperature > 0 else None)
            argmax = logits.argmax(-1).cpu()
            for r in range(rows):
                if r % n_rows == 0:  # the most-likely row of its question
                    chosen[r] = (argmax[r] if ml_probs is None
                                 else torch.multinomial(ml_probs[r], 1, generator=generators[r])[0])
                else:
                    chosen[r] = torch.multinomial(sample_probs[r], 1, generator=generators[r])[0]
            for r in range(rows):
                if done[r]:
                    continue
                token = int(chosen[r])
                if token in self.stop_ids:
                    done[r], stopped[r] = True, True
                    continue
                tokens[r].append(token)
                logprobs[r].append(float(log_probs[r, token]))
            if all(done) or step == cfg.max_new_tokens - 1:
                break
            feed = torch.tensor([pad if done[r] else int(chosen[r]) for r in range(rows)], dtype=torch.long)
            mask = torch.cat([mask, torch.tensor([[0 if done[r] else 1] for r in range(rows)],
                                                 device=mask.device)], dim=1)
            last_pos = last_pos + 1
            out = self._forward(input_ids=feed.view(-1, 1).to(self.loaded.device), attention_mask=mask,
                                position_ids=last_pos.view(-1, 1), past_key_values=cache)
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
        results = []
        for qi in range(len(encoded)):
            per_question = []
            for s in range(n_rows):
                r = qi * n_rows + s
                per_question.append({"tokens": tokens[r], "logprobs": logprobs[r], "stopped": stopped[r]})
            results.append(per_question)
        return results

    def _text(self, token_ids: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[str], *, run_key: str) -> pl.DataFrame:
        """Most-likely answer (sample_index 0) plus n_samples samples per question, as GENERATIONS rows."""
        import polars as pl
        import torch

        if len(question_ids) != len(prompts):
            raise ValueError(f"question_ids ({len(question_ids)}) and prompts ({len(prompts)}) differ in length")
        encoded, truncated = self._encode(prompts)
        records: list[dict[str, Any]] = []
        start = 0
        while start < len(prompts):
            per_chunk = max(1, self._rows_per_forward // (self.config.n_samples + 1))
            stop = min(len(prompts), start + per_chunk)
            try:
                chunk = self._decode_chunk(encoded[start:stop], question_ids[start:stop])
            except RuntimeError as exc:
                if "out of memory" not in str(exc).lower() or per_chunk == 1 and self._rows_per_forward <= 1:
                    raise
                self._rows_per_forward = max(1, self._rows_per_forward // 2)
                log.warning("out of memory: %d rows per forward pass from now on", self._rows_per_forward)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            for offset, rows in enumerate(chunk):
                qi = start + offset
                for s, row in enumerate(rows):
                    records.append(self._record(run_key, question_ids[qi], s, row, truncated[qi]))
            start = stop
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
                "is_greedy": sample_index == 0, "option_probs": None, "flags": flags}

    # -- multiple choice -------------------------------------------------------------------------------------

    def _letter_ids(self, label: str) -> list[int]:
        """First token ids of the letter as it may follow the prompt: "A" and " A"."""
        ids = set()
        for variant in (label, f" {label}"):
            tokens = self.loaded.tokenizer(variant, add_special_tokens=False)["input_ids"]
            if tokens:
                ids.add(tokens[0])
        return sorted(ids)

    def choose(self, question_ids: Sequence[str], prompts: Sequence[str], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        """Option-letter distribution per question; arg-max letter plus n_samples draws, as GENERATIONS rows."""
        import polars as pl
        import torch

        if not len(question_ids) == len(prompts) == len(choice_labels):
            raise ValueError("question_ids, prompts and choice_labels differ in length")
        encoded, truncated = self._encode(prompts)
        records: list[dict[str, Any]] = []
        step = max(1, self._rows_per_forward // 4)
        for start in range(0, len(prompts), step):
            input_ids, mask = self._padded(encoded[start:start + step])
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
            probs_all = torch.softmax(logits[:, -1, :].float(), dim=-1).cpu()
            for offset in range(input_ids.shape[0]):
                qi = start + offset
                labels = list(choice_labels[qi])
                if not labels:
                    raise ValueError(f"question_id {question_ids[qi]!r}: choice_labels is empty")
                mass = np.array([float(probs_all[offset, self._letter_ids(lab)].sum()) for lab in labels])
                option_probs = mass / mass.sum() if mass.sum() > 0 else np.full(len(labels), 1 / len(labels))
                g = torch.Generator(device="cpu")
                g.manual_seed(row_seed(self.config.seed, question_ids[qi], 0))
                draws = torch.multinomial(torch.tensor(option_probs), self.config.n_samples, replacement=True,
                                          generator=g).tolist()
                picks = [int(np.argmax(option_probs))] + draws
                for s, pick in enumerate(picks):
                    records.append({
                        "run_key": run_key, "question_id": str(question_ids[qi]), "sample_index": s,
                        "text": labels[pick], "n_tokens": 1, "logprob_sum": math.log(max(option_probs[pick], 1e-300)),
                        "logprob_mean": math.log(max(option_probs[pick], 1e-300)), "is_greedy": s == 0,
                        "option_probs": option_probs.tolist(),
                        "flags": ["prompt_truncated"] if truncated[qi] else []})
        return schema.conform(pl.DataFrame(records, schema=schema.GENERATIONS.schema), schema.GENERATIONS)


def generate_for_questions(generator: AnswerGenerator, questions: pl.DataFrame, prompts: Sequence[str], *,
                           run_key: str) -> pl.DataFrame:
    """GENERATIONS rows for a QUESTIONS frame: option letters where `choices` is set, free text otherwise."""
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
        parts.append(generator.generate_open([ids[i] for i in open_], [prompts[i] for i in open_], run_key=run_key))
    if not parts:
        return pl.DataFrame(schema=schema.GENERATIONS.schema)
    return pl.concat(parts)
