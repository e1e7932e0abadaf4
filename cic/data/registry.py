"""The dataset registry: each dataset is one small `DatasetSpec` (how to read a record, where the data lives,
which prompt asks its questions). Adding a dataset is one `DATASETS.register(...)` call or one config entry
(`DATASETS.register_config({...})`, e.g. from the pipeline's YAML), never an edit of the pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cic.data.prompts import MC_LETTER_V1, SHORT_ANSWER_V1, PromptBuilder, get_prompt
from cic.data.records import (
    RecordParser,
    commonsense_qa_record,
    multiple_choice_fields,
    open_ended_fields,
    trivia_qa_record,
)
from cic.errors import UserError
from cic.registry import Registry


@dataclass(frozen=True)
class DatasetSpec:
    """How to load one dataset: its record parser, default prompt and where its data can come from."""

    name: str
    parse: RecordParser                  # one source record -> canonical question fields
    prompt: PromptBuilder                # the default prompt (its id goes into the run key)
    hub_id: str | None = None            # Hugging Face hub id for `source="hub"`
    hub_config: str | None = None        # hub config name, e.g. "rc.nocontext"
    sample: str | None = None            # bundled file under cic/data/samples (validation split)
    default_source: str | None = None    # a local file or directory used when no source is given
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise UserError(f"dataset name = {self.name!r}: use letters, digits, '_' or '-'")


COMMONSENSE_QA = DatasetSpec(
    name="commonsense_qa", parse=commonsense_qa_record, prompt=MC_LETTER_V1, hub_id="tau/commonsense_qa",
    sample="commonsense_qa_validation.jsonl",
    description="CommonsenseQA (Talmor et al., 2019): 5-option multiple choice, gold = option letter")
TRIVIA_QA = DatasetSpec(
    name="trivia_qa", parse=trivia_qa_record, prompt=SHORT_ANSWER_V1, hub_id="mandarjoshi/trivia_qa",
    hub_config="rc.nocontext", sample="trivia_qa_validation.jsonl",
    description="TriviaQA rc.nocontext (Joshi et al., 2017): open-ended, gold answer value plus aliases")

_KINDS = {"open": (open_ended_fields, SHORT_ANSWER_V1), "multiple_choice": (multiple_choice_fields, MC_LETTER_V1)}
_FIELD_KEYS = {"open": {"question_id", "question", "answer", "aliases"},
               "multiple_choice": {"question_id", "question", "choices", "answer", "choice_labels"}}


class DatasetRegistry:
    """Datasets by name. `DATASETS` holds the built-ins; `copy()` gives an independent registry."""

    def __init__(self, specs: Mapping[str, DatasetSpec] | None = None) -> None:
        self._specs: Registry[DatasetSpec] = Registry("dataset", dict(specs or {}))

    def register(self, spec: DatasetSpec, *, replace: bool = False) -> DatasetSpec:
        """Add a dataset; an existing name is an error unless `replace=True`."""
        return self._specs.register(spec, replace=replace)

    def register_config(self, entry: Mapping[str, Any], *, replace: bool = False) -> DatasetSpec:
        """Add a dataset from a plain mapping (e.g. YAML): name, path, kind, fields, optional prompt_id.

        `kind` is "open" (fields question_id, question, answer, aliases) or "multiple_choice" (fields
        question_id, question, choices, answer, choice_labels); `fields` maps each to the source's column.
        """
        unknown = set(entry) - {"name", "path", "kind", "fields", "prompt_id", "description"}
        if unknown:
            raise UserError(f"dataset entry: unknown key(s) {', '.join(sorted(unknown))}")
        kind = entry.get("kind", "open")
        if kind not in _KINDS:
            raise UserError(f"dataset entry {entry.get('name')!r}: kind = {kind!r}; use one of {', '.join(_KINDS)}")
        fields = dict(entry.get("fields") or {})
        bad = set(fields) - _FIELD_KEYS[kind]
        if bad:
            raise UserError(f"dataset entry {entry.get('name')!r}: fields {', '.join(sorted(bad))} do not apply to "
                             f"kind {kind!r}; allowed: {', '.join(sorted(_FIELD_KEYS[kind]))}")
        make_parser, prompt = _KINDS[kind]
        if "prompt_id" in entry:
            prompt = get_prompt(entry["prompt_id"])
        path = entry.get("path")
        spec = DatasetSpec(name=str(entry.get("name", "")), parse=make_parser(**fields), prompt=prompt,
                           default_source=None if path is None else str(Path(path).expanduser()),
                           description=str(entry.get("description", "")))
        return self.register(spec, replace=replace)

    def get(self, name: str) -> DatasetSpec:
        """The dataset named `name`; a UserError naming the registered ones otherwise."""
        return self._specs.lookup(name)

    def prompt_for(self, dataset: str, prompt_id: str | None = None) -> PromptBuilder:
        """The dataset's default prompt, or the built-in one named by `prompt_id`."""
        spec = self.get(dataset)
        if prompt_id is None or prompt_id == spec.prompt.prompt_id:
            return spec.prompt
        return get_prompt(prompt_id)

    def copy(self) -> DatasetRegistry:
        return DatasetRegistry(dict(self._specs))

    def __iter__(self) -> Iterator[DatasetSpec]:
        return iter(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return list(self._specs)


DATASETS = DatasetRegistry({s.name: s for s in (COMMONSENSE_QA, TRIVIA_QA)})


def prompt_builder(question_row: Mapping[str, Any], prompt_id: str | None = None,
                   registry: DatasetRegistry = DATASETS) -> PromptBuilder:
    """The prompt of a QUESTIONS row: `prompt_id`, else its dataset's default."""
    dataset = question_row.get("dataset")
    if prompt_id is None and dataset is None:
        raise UserError("question row has no 'dataset' field; pass prompt_id to choose the prompt")
    return get_prompt(prompt_id) if dataset is None else registry.prompt_for(str(dataset), prompt_id)


def build_prompt(question_row: Mapping[str, Any], *, tokenizer: Any = None, prompt_id: str | None = None,
                 registry: DatasetRegistry = DATASETS) -> str:
    """The full prompt for one QUESTIONS row (see `cic.data.prompts` for the contract)."""
    return prompt_builder(question_row, prompt_id, registry).build(question_row, tokenizer)


def build_messages(question_row: Mapping[str, Any], *, prompt_id: str | None = None,
                   registry: DatasetRegistry = DATASETS) -> list[dict[str, str]]:
    """One QUESTIONS row's prompt as chat messages, for a served model's chat API (its own template applies)."""
    return prompt_builder(question_row, prompt_id, registry).messages(question_row)
