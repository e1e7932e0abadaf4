"""The served model as the answer generator: GENERATIONS rows from an `EndpointClient` with the contract of
`cic.llm.generation.AnswerGenerator` (most-likely answer and K seeded samples a question, requests spread over the
replicas at most `max_in_flight` at a time; a question whose requests failed for good gets no rows)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cic import schema
from cic.errors import UserError
from cic.llm.served_identity import n_choices_problem

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.generation import GenerationConfig


from cic.llm.endpoint import EndpointClient, EndpointStats, Prompt, log
from cic.llm.endpoint_replies import EndpointError, RequestOutcome, option_letter, option_probs_from_top
from cic.llm.endpoint_spec import sample_seed


class EndpointGenerator:
    """GENERATIONS rows from a served model, with the contract of `cic.llm.generation.AnswerGenerator`
    (`generate_open`, `choose`); a question whose requests failed for good gets no rows (`stats.failed_questions`
    says why), so a rerun asks it again."""

    def __init__(self, client: EndpointClient, config: GenerationConfig) -> None:
        self.client = client
        self.config = config

    @property
    def stats(self) -> EndpointStats:
        return self.client.stats

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[Prompt], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        """Most-likely answer plus n_samples samples of free text per question; `indices`: only those rows."""
        return self._frame(question_ids, prompts, None, run_key, indices)

    def choose(self, question_ids: Sequence[str], prompts: Sequence[Prompt], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        """The option each answer names; option probabilities from the greedy answer's first-token top
        log-probabilities where the server returns them (`endpoint.top_logprobs`), else null."""
        if not len(question_ids) == len(prompts) == len(choice_labels):
            raise ValueError("question_ids, prompts and choice_labels differ in length")
        return self._frame(question_ids, prompts, [list(labels) for labels in choice_labels], run_key)

    def _frame(self, question_ids: Sequence[str], prompts: Sequence[Prompt], labels: list[list[str]] | None,
               run_key: str, indices: Sequence[int] | None = None) -> pl.DataFrame:
        import polars as pl

        if self.client.served_model is None:
            self.client.probe()
        rows = list(range(self.config.n_samples + 1)) if indices is None else list(indices)
        records = asyncio.run(self._all(question_ids, prompts, labels, run_key, rows))
        return schema.conform(pl.DataFrame(records, schema=schema.GENERATIONS.schema), schema.GENERATIONS)

    def _rows_of(self, question_id: str, outcomes: list[RequestOutcome], labels: list[str] | None,
                 run_key: str, indices: Sequence[int]) -> list[dict[str, Any]]:
        rows = []
        read = labels and (self.client.spec.top_logprobs > 0 or self.client.named_tokens)  # not from the 1 asked
        probs = option_probs_from_top(outcomes[0].first_top, labels) if read else None
        for index, outcome in zip(indices, outcomes, strict=True):
            text = outcome.text.strip()
            if self.config.stop_at_newline:
                text = text.split("\n", 1)[0].strip()
            if labels:
                text = option_letter(text, labels)
            lps = outcome.token_logprobs
            n_tokens = len(lps) if lps is not None else outcome.completion_tokens or 0
            total = float(sum(lps)) if lps is not None else None
            flags = [flag for flag, on in (("empty", not text), ("max_tokens", outcome.finish_reason == "length"),
                                           ("no_logprobs", lps is None)) if on]
            rows.append({"run_key": run_key, "question_id": str(question_id), "sample_index": index, "text": text,
                         "n_tokens": n_tokens, "logprob_sum": total,
                         "logprob_mean": total / len(lps) if lps else None, "is_greedy": index == 0,
                         "option_probs": probs, "flags": flags})
        return rows

    async def _question(self, client: Any, url: str, gate: asyncio.Semaphore, question_id: str,
                        prompt: Prompt, labels: list[str] | None, indices: Sequence[int]) -> list[RequestOutcome]:
        """The rows `indices` of one question (0 the most-likely answer, s ≥ 1 sample s): the samples in one request
        asking for `n` where the server honours it (checked: count and indices; seeded by the first sample's
        index), else one seeded request each. For a multiple-choice question on a server that takes named token
        ids, the greedy request names the option letters'."""
        cfg = self.config
        stop = ("\n",) if cfg.stop_at_newline else ()
        named = await self.client.label_token_ids(client, url, labels) if labels and self.client.named_tokens else []

        async def ask(index: int, n: int = 1) -> list[RequestOutcome]:
            temperature = cfg.most_likely_temperature if index == 0 else cfg.temperature
            body = self.client._body(prompt, temperature=temperature, top_p=cfg.top_p,
                                     max_tokens=cfg.max_new_tokens, seed=sample_seed(cfg.seed, question_id, index),
                                     stop=stop, logprobs=self.client.logprobs)
            if index == 0 and named:
                body["logprob_token_ids"] = named
            async with gate:
                return await self.client.post(client, url, {**body, "n": n} if n > 1 else body)

        wanted = [i for i in indices if i > 0]
        if self.client.server_n and len(wanted) > 1:
            *greedy, samples = await asyncio.gather(*([ask(0)] if 0 in indices else []), ask(wanted[0], len(wanted)))
            head = [g[0] for g in greedy]
            problem = n_choices_problem([o.index for o in samples], [o.text for o in samples], len(wanted),
                                        distinct=False)
            if problem is None:
                return [*head, *sorted(samples, key=lambda o: o.index or 0)]
            self.client.server_n = False  # the server stopped honouring n: seeded single requests from here on
            log.warning("%s: %s; samples now come one seeded request each", url, problem)
            return [*head, *[r[0] for r in await asyncio.gather(*(ask(i) for i in wanted))]]
        return [r[0] for r in await asyncio.gather(*(ask(i) for i in indices))]

    async def _all(self, question_ids: Sequence[str], prompts: Sequence[Prompt], labels: list[list[str]] | None,
                   run_key: str, indices: Sequence[int]) -> list[dict[str, Any]]:
        urls = self.client.spec.urls
        gates = {url: asyncio.Semaphore(self.client.spec.max_in_flight) for url in urls}
        async with self.client._client() as client:
            if labels and self.client.named_tokens and (live := self.client._replica(urls[0])):
                await self.client.label_token_ids(client, live, sorted({x for row in labels for x in row}))
            if not self.client.n_checked and self.config.n_samples > 1 and (live := self.client._replica(urls[0])):
                await self.client.check_server_n(client, live)
            tasks = [self._question(client, urls[i % len(urls)], gates[urls[i % len(urls)]], str(qid), prompt,
                                    labels[i] if labels else None, indices)
                     for i, (qid, prompt) in enumerate(zip(question_ids, prompts, strict=True))]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.still_serving(client, [o for r in results if isinstance(r, list) for o in r])
        rows = []
        for i, (qid, result) in enumerate(zip(question_ids, results, strict=True)):
            if isinstance(result, UserError):
                raise result
            if isinstance(result, BaseException):
                if not isinstance(result, EndpointError):
                    raise result
                self.client.stats.failed_questions[str(qid)] = str(result)
                continue
            rows.extend(self._rows_of(str(qid), result, labels[i] if labels else None, run_key, indices))
        return rows
