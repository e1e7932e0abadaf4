"""The engine interface: one way answers are generated (weights CIC loads, a served model, ...). An engine says
what it offers (`Capabilities`), probes once per run for the identity that keys the run (`EngineProbe`, passed
down to every worker so none probes again), builds prompts in the form it takes, and generates GENERATIONS rows
for a batch of questions. `cic.llm.engines.registry` finds an engine by name; nothing outside this package names a
concrete one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from cic.llm.engines.probe import EngineProbe

if TYPE_CHECKING:
    import polars as pl

    from cic.llm.settings import AnswererSettings


@dataclass(frozen=True)
class Capabilities:
    """What an engine's answers carry: token log-probabilities, option probabilities (multiple choice), seeded
    samples, samples drawn n to a request; and whether it loads weights in the worker (and so wants a GPU)."""

    token_logprobs: bool
    option_probs: bool
    seeds: bool
    server_samples: bool
    local_weights: bool

    def offers(self) -> list[str]:
        """The data needs (`cic.llm.uncertainty.estimators.DATA_NEEDS`) its answers meet."""
        return [need for need, on in (("token_logprobs", self.token_logprobs), ("option_probs", self.option_probs))
                if on]


class Engine(ABC):
    """One model's answers, built in a worker from its `AnswererSettings`.

    An engine that a config names by `engine:` declares its `options:` as a pydantic model (`Options`): the config
    validates them once (one line per bad field) and the worker finds them, validated, in
    `settings.engine_options`."""

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel] | None] = None

    @classmethod
    def source(cls, options: dict[str, Any]) -> str:
        """What the model is, in one string (tables, MLflow), from its validated options."""
        return f"{cls.name} {options}" if options else cls.name

    @classmethod
    def max_failed_share(cls, options: dict[str, Any]) -> float:
        """The share of questions that may stay unanswered (0: a failure is an error)."""
        return float(options.get("max_failed_share", 0.0))

    def __init__(self, settings: AnswererSettings) -> None:
        self.settings = settings

    # -- once per run, in the flow (no worker yet) -------------------------------------------------------------
    @classmethod
    @abstractmethod
    def probe(cls, settings: AnswererSettings) -> EngineProbe:
        """Ask the model what it is before any work: a UserError (one line) when it cannot answer."""

    @classmethod
    @abstractmethod
    def run_key(cls, settings: AnswererSettings, probe: EngineProbe) -> dict[str, Any]:
        """What shapes this engine's generations, for the run key: its identity and the decoding settings."""

    @classmethod
    def describe(cls, probe: EngineProbe) -> str | None:
        """What the run's probe found, in one line for the console and the flow's log (None: nothing to say)."""
        return None

    @classmethod
    def certified_identity(cls, generation_config: dict[str, Any]) -> str | None:
        """The identity a stored run was keyed on (None where the spec keys it)."""
        return None

    @classmethod
    def gpus(cls, requested: float) -> float:
        """GPUs a worker of this engine asks Ray for, given the model's `gpus_per_replica`."""
        return requested

    # -- in a worker -----------------------------------------------------------------------------------------
    @abstractmethod
    def load(self) -> None:
        """Make it ready to answer (weights loaded, or the run's probe adopted): a replica is ready only then."""

    @property
    @abstractmethod
    def loaded(self) -> bool:
        """Whether `load` ran (a worker that only re-scores stored answers never loads)."""

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What its answers carry (after `load`, where a probe decides it)."""

    @property
    @abstractmethod
    def device(self) -> Any:
        """Where the embedder and NLI model run beside it."""

    @abstractmethod
    def prompts(self, rows: Sequence[dict[str, Any]], prompt_id: str | None) -> list[Any]:
        """The prompt of every question row, in the form this engine takes."""

    @abstractmethod
    def generate_open(self, question_ids: Sequence[str], prompts: Sequence[Any], *, run_key: str,
                      indices: Sequence[int] | None = None) -> pl.DataFrame:
        """Most-likely answer plus the samples of free text per question (GENERATIONS rows); `indices`: only those
        rows (0 the most likely answer, s ≥ 1 sample s), as an adaptive round asks."""

    @abstractmethod
    def choose(self, question_ids: Sequence[str], prompts: Sequence[Any], choice_labels: Sequence[Sequence[str]],
               *, run_key: str) -> pl.DataFrame:
        """Multiple choice: the option each answer names (GENERATIONS rows)."""

    def take_failures(self) -> dict[str, str]:
        """Questions of the last calls that got no answer (id -> why), forgotten once taken: a rerun asks them."""
        return {}

    def take_moved(self) -> int:
        """Requests of the last calls handed to another replica after theirs stopped answering, counted once."""
        return 0

    @abstractmethod
    def ready(self) -> dict[str, Any]:
        """What this worker runs on, for the run's log (answers once `load` ran)."""
