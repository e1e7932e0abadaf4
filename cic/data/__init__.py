"""Datasets: loaders to the QUESTIONS layout, the dataset registry, versioned prompt builders, offline samples.

    from cic.data import load_questions, build_prompt
    questions = load_questions("commonsense_qa", limit=50, seed=0)   # bundled sample, no internet needed
    prompt = build_prompt(questions.row(0, named=True))               # few-shot plain prompt ending "Answer:"

Imports polars; `import cic` does not import this package.
"""

from cic.data.loaders import load_questions
from cic.data.prompts import MC_LETTER_V1, PROMPTS, SHORT_ANSWER_V1, PromptBuilder, get_prompt
from cic.data.records import RecordError, multiple_choice_fields, open_ended_fields
from cic.data.registry import DATASETS, DatasetRegistry, DatasetSpec, build_messages, build_prompt
from cic.data.sources import DatasetSourceError

__all__ = [
    "DATASETS",
    "MC_LETTER_V1",
    "PROMPTS",
    "SHORT_ANSWER_V1",
    "DatasetRegistry",
    "DatasetSourceError",
    "DatasetSpec",
    "PromptBuilder",
    "RecordError",
    "build_messages",
    "build_prompt",
    "get_prompt",
    "load_questions",
    "multiple_choice_fields",
    "open_ended_fields",
]
