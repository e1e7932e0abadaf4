"""An engine added the way docs/engines.md says a new backend is added — this one file and one registry line
(`ENGINES.register("tests.support.replay_engine:ReplayEngine", name="replay")`), no edit to cic/pipeline: it answers
from a JSON-lines file of recorded answers (`question_id`, `sample_index`, `text`, optional `logprob_sum`,
`option_probs`), as a team replays a model's answers captured elsewhere. A question the file lacks is a failure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, field_validator

from cic import schema
from cic.errors import UserError
from cic.llm.engines import Capabilities, Engine, EngineProbe
from cic.llm.settings import AnswererSettings


class ReplayOptions(BaseModel):
    """The replay engine's options: the file of recorded answers and how many may be missing."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str = Field(min_length=1)
    max_failed_share: float = Field(0.0, ge=0, le=1)

    @field_validator("file")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not Path(value).is_file():
            raise ValueError("no such file")
        return value


class ReplayEngine(Engine):
    """Answers recorded in a file: every sample index the file holds for a question, nothing for one it lacks."""

    name = "replay"
    Options = ReplayOptions

    def __init__(self, settings: AnswererSettings) -> None:
        super().__init__(settings)
        self.options = ReplayOptions.model_validate(settings.engine_options or {})
        self._answers: dict[str, list[dict[str, Any]]] | None = None
        self._failures: dict[str, str] = {}
        self.calls: list[tuple[list[str], list[int] | None]] = []  # (questions, rows asked) of every generate_open

    @classmethod
    def source(cls, options: dict[str, Any]) -> str:
        return f"replay of {Path(options['file']).name}"

    @classmethod
    def probe(cls, settings: AnswererSettings) -> EngineProbe:
        options = ReplayOptions.model_validate(settings.engine_options or {})
        digest = schema.value_hash(Path(options.file).read_bytes())[:16]
        return EngineProbe(identity=f"replay:{digest}", state={"file": options.file})

    @classmethod
    def run_key(cls, settings: AnswererSettings, probe: EngineProbe) -> dict[str, Any]:
        return {"replay": probe.identity, **settings.generation.shaping()}

    def load(self) -> None:
        try:
            rows = pl.read_ndjson(self.options.file).to_dicts()
        except pl.exceptions.ComputeError as exc:
            raise UserError(f"{self.options.file}: not JSON lines ({str(exc).splitlines()[0]})") from None
        answers: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            answers.setdefault(str(row["question_id"]), []).append(row)
        self._answers = answers

    @property
    def loaded(self) -> bool:
        return self._answers is not None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_logprobs=True, option_probs=True, seeds=False, server_samples=False,
                            local_weights=False)

    @property
    def device(self) -> Any:
        return "cpu"

    def prompts(self, rows: Sequence[dict[str, Any]], prompt_id: str | None) -> list[Any]:
        return [row.get("question", "") for row in rows]

    def _rows(self, question_ids: Sequence[str], run_key: str, choices: bool,
              indices: Sequence[int] | None = None) -> pl.DataFrame:
        assert self._answers is not None, "load() first"
        out = []
        for qid in question_ids:
            recorded = self._answers.get(str(qid))
            if not recorded:
                self._failures[str(qid)] = f"no recorded answer in {Path(self.options.file).name}"
                continue
            for row in recorded:
                if indices is not None and int(row["sample_index"]) not in indices:
                    continue
                text, total = str(row["text"]), row.get("logprob_sum")
                tokens = max(1, len(text.split()))
                out.append({"run_key": run_key, "question_id": str(qid), "sample_index": int(row["sample_index"]),
                            "text": text, "n_tokens": tokens, "logprob_sum": total,
                            "logprob_mean": None if total is None else total / tokens,
                            "is_greedy": int(row["sample_index"]) == 0,
                            "option_probs": row.get("option_probs") if choices else None, "flags": []})
        return schema.conform(pl.DataFrame(out, schema=schema.GENERATIONS.schema), schema.GENERATIONS)

    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[Any], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        self.calls.append((list(question_ids), None if indices is None else list(indices)))
        return self._rows(question_ids, run_key, choices=False, indices=indices)

    def choose(self, question_ids: Sequence[str], prompts: Sequence[Any], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        return self._rows(question_ids, run_key, choices=True)

    def take_failures(self) -> dict[str, str]:
        taken, self._failures = self._failures, {}
        return taken

    def ready(self) -> dict[str, Any]:
        return {"model": self.source(self.options.model_dump()), "device": "cpu", "dtype": None,
                "llm_loaded": self.loaded, "offers": self.capabilities.offers()}
