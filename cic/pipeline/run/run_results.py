"""What a pipeline run returns, stage by stage, as typed records: the flow returns them, the CLI, the Prefect
artifacts and the benchmarks read their fields (never a dict re-read by string keys)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class AnswerStats:
    """What the answering stage did for one model."""

    model: str
    questions: int = 0
    generated: int = 0
    tokens: int = 0            # tokens generated in this run (most-likely answers and samples)
    generations: int = 0       # answers generated in this run (a multiple-choice question's one forward pass: 1)
    batches: int = 0
    actors: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    load_s: float = 0.0        # until its first batch landed (actors start, load the model, answer one batch)
    llm_loaded: bool = True    # False: every question was only re-scored from stored generations
    error: str | None = None   # why this model failed (the others went on); None when it finished
    nodes: list[str] = field(default_factory=list)  # Ray node of each replica that started (replacements too)
    failed: int = 0            # questions a served model gave no answer to after its retries (a rerun asks again)
    moved: int = 0             # requests handed to another replica after theirs stopped answering (answered there)
    failure: str | None = None  # the first reason

    @property
    def generations_per_question(self) -> float:
        """Answers generated per question generated this run (11 with ten samples; fewer under adaptive rounds)."""
        return self.generations / self.generated if self.generated else 0.0

    @property
    def questions_per_s(self) -> float:
        busy = self.wall_s - self.load_s
        return self.generated / busy if busy > 0 and self.generated else 0.0


@dataclass
class CalibrateStats:
    """How many groups were calibrated and how many gates were unattainable."""

    groups: int = 0
    calibrations: int = 0
    evaluations: int = 0
    unattainable: int = 0
    promoted: int = 0          # gates that went live because their key had no live gate yet
    group_studies: int = 0     # (model, estimator, criterion) studies over datasets (`group_by: dataset`)
    systems: int = 0           # (system, dataset, criterion) of cascades and estimator choices certified
    system_gates: int = 0      # their (alpha, bound) gates, and how many certify nothing
    system_unattainable: int = 0


@dataclass
class LogStats:
    """What a logging pass did."""

    logged: int = 0
    already: int = 0
    run_ids: list[str] = field(default_factory=list)
    report_s: float = 0.0  # of the pass, seconds spent reading the store and rendering reports (as --no-mlflow)
    views: dict[str, str] = field(default_factory=dict)  # experiment name -> MLflow UI route of its α view


@dataclass
class CalibrationRunSummary:
    """What calibrating the stored runs did (`calibrate_flow`): the runs, the calibrate stage, the logging pass."""

    run_keys: list[str]
    calibrate: CalibrateStats
    log: LogStats | None = None


@dataclass
class PipelineSummary:
    """What one pipeline run did: where its data went, each stage's statistics and seconds, every result cell,
    and the per-dataset study (`group_by: dataset`)."""

    db: str
    tracking_uri: str
    report_dir: str
    experiment_prefix: str = "cic"
    run_keys: list[str] = field(default_factory=list)
    answer: list[AnswerStats] = field(default_factory=list)
    probes: Any = None  # cic.pipeline.run.probe_stage.ProbeStats, where probes.kinds fits any
    calibrate: CalibrateStats | None = None
    log: LogStats | None = None
    log_error: str | None = None
    live: list[str] = field(default_factory=list)  # the live gates of the run's groups (single and system)
    registered: list[str] = field(default_factory=list)  # registered models they are in
    registry_error: str | None = None  # why the registry does not (yet) hold the gates made live
    reports: int = 0  # group reports written without MLflow (`--no-mlflow`)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    results: list[ResultRow] = field(default_factory=list)
    per_dataset: list[dict[str, Any]] = field(default_factory=list)  # `group_evaluations` rows, every column
    per_dataset_file: str | None = None
    per_dataset_note: str | None = None
    systems: list[SystemResultRow] = field(default_factory=list)  # cascades and estimators chosen
    flow_run_id: str | None = None

    @property
    def failed_models(self) -> list[AnswerStats]:
        return [a for a in self.answer if a.error]


@dataclass(frozen=True)
class SystemResultRow:
    """One system (a cascade, or a model with its estimator chosen) at one (alpha, bound): the gate certified on
    all its pairs and its split protocol — what the closing table and the Prefect digest show beside single
    models."""

    system: str
    kind: str
    models: tuple[str, ...]
    dataset: str
    criterion: str
    alpha: float
    bound: str
    search: str
    estimators: tuple[str, ...]        # the gate's estimator per stage (empty: it certifies nothing)
    thresholds: tuple[float | None, ...]
    shares: tuple[float, ...]          # the gate's share of calibration questions per stage
    fdr_mean: float | None
    fdr_above_alpha: float | None
    coverage_mean: float | None
    shares_mean: tuple[float, ...]     # per stage, over the test parts of the splits
    fails: int | None
    n_splits: int | None

    @property
    def certified(self) -> bool:
        return any(t is not None for t in self.thresholds)


@dataclass(frozen=True)
class GroupPlace:
    """Where a gate sits: its group (model, dataset, estimator, criterion) and configuration (alpha, bound,
    search)."""

    model: str
    dataset: str
    estimator: str
    criterion: str
    alpha: float
    bound: str
    search: str

    @property
    def label(self) -> str:
        return (f"{self.model}/{self.dataset} {self.estimator} × {self.criterion} α={self.alpha:g} {self.bound} "
                f"{self.search}")


@dataclass(frozen=True)
class ResultRow(GroupPlace):
    """One split-protocol cell of a run (the newest stored evaluation of its key): where it sits, then its FDR,
    coverage and fails over the splits."""

    fdr_mean: float | None
    fdr_std: float | None
    coverage_mean: float
    fails: int
    n_splits: int
    delta: float
    n_cal: int
    base_error_rate: float
    score_limit: float | None = None   # the best threshold on the score in-sample (None: stored before it was kept)
    ceiling: float | None = None       # any rule's coverage at alpha

    @property
    def certified(self) -> bool:
        """Some calibration split found a threshold."""
        return self.fails < self.n_splits

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ResultRow:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def stage_thresholds(thresholds: Sequence[float | None], digits: str = ".4g") -> str:
    """A system gate's thresholds in stage order as every surface prints them: 'never' for a stage that never
    answers (`digits`: the format of the others; MLflow's tables keep more)."""
    return " / ".join("never" if t is None else format(t, digits) for t in thresholds)


@dataclass(frozen=True)
class CandidateRow:
    """One candidate gate a recalibration wrote, beside the live gate of its key."""

    place: GroupPlace
    gate_id: str
    state: str
    threshold: float | None
    n_window: int
    live_threshold: float | None
    alerts: list[str]
    thresholds: tuple[float | None, ...] | None = None       # a system gate's, one per stage (None: unattainable)
    live_thresholds: tuple[float | None, ...] | None = None  # the live system gate's
    live_id: str | None = None  # the gate that spoke for its key before the pass

    @property
    def unattainable(self) -> bool:
        return self.threshold is None and self.thresholds is None

    def shown(self, live: bool = False) -> str | None:
        """The (live) gate's threshold as tables print it — a system's one per stage (`stage_thresholds`) —,
        'unattainable', or None for no live gate."""
        one, many = (self.live_threshold, self.live_thresholds) if live else (self.threshold, self.thresholds)
        if many is not None:
            return stage_thresholds(many)
        if one is not None:
            return f"{one:.4g}"
        return None if live else "unattainable"


@dataclass(frozen=True)
class AlertRow:
    """One alert of a recalibration: drift, an unattainable alpha, or a live gate's monitor alarm."""

    place: GroupPlace
    alert: str  # a `cic.pipeline.alerts.Alert`: its sentence with its kind

    @property
    def kind(self) -> str:
        from cic.pipeline.alerts import kind_of

        return kind_of(self.alert).name

    @property
    def severity(self) -> str:
        """"page" (fails the run) or "warning" (completes it with a note): `cic.pipeline.alerts`."""
        from cic.pipeline.alerts import severity

        return severity(self.alert)


@dataclass(frozen=True)
class AnytimeRow:
    """One anytime key and alpha after this pass: what it counted, what waits or was never counted, the first
    threshold's e-value and what it certifies."""

    place: GroupPlace
    counted_now: int
    counted: int
    waiting: int
    unlabelled: int
    late: int
    first_e_value: float
    threshold: float | None

    def line(self) -> str:
        certified = "nothing certified yet" if self.threshold is None else f"certifies {self.threshold:.4g}"
        extra = "".join(f", {n} {what}" for n, what in ((self.waiting, "waiting for their label window"),
                                                         (self.unlabelled, "unlabelled past it"),
                                                         (self.late, "labelled too late")) if n)
        return (f"{self.place.model}/{self.place.dataset} {self.place.estimator} × {self.place.criterion} "
                f"α={self.place.alpha:g}: {self.counted_now} answer(s) counted tonight, {self.counted} in all"
                f"{extra}; first threshold's e-value {self.first_e_value:.3g}; {certified}")


@dataclass(frozen=True)
class MonitorRow:
    """A live gate's anytime-valid monitor after this pass."""

    place: GroupPlace
    gate_id: str
    threshold: float | None
    nights: int
    n: int
    k: int
    e_value: float
    alarm_at: float
    rate_lower_bound: float
    alarmed: bool
    new_pairs: int


@dataclass(frozen=True)
class SkippedGroup:
    """A group the pass did not recalibrate, and why."""

    model: str
    dataset: str
    estimator: str
    criterion: str
    reason: str


@dataclass(frozen=True)
class DriftTestRow:
    """One drift test of the pass, after Holm across every test."""

    model: str
    dataset: str
    estimator: str
    criterion: str
    test: str
    p_value: float
    rejected: bool


@dataclass
class RecalibrationSummary:
    """What one recalibration did: its candidates, alerts, monitors, skipped groups, tests and promotions, and
    what reached MLflow."""

    candidates: list[CandidateRow] = field(default_factory=list)
    alerts: list[AlertRow] = field(default_factory=list)
    monitors: list[MonitorRow] = field(default_factory=list)
    skipped: list[SkippedGroup] = field(default_factory=list)
    tests: list[DriftTestRow] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)
    withdrawn: dict[str, str] = field(default_factory=dict)  # live gate id -> why it stopped serving
    anytime: list[AnytimeRow] = field(default_factory=list)  # the anytime rule's progress per key and alpha
    serving: list[Any] = field(default_factory=list)  # `cic.pipeline.gates.serving_now.ServingRow`, after the pass
    mlflow_run_ids: list[str] = field(default_factory=list)
    log_error: str | None = None
    registry_error: str | None = None

    @property
    def gates(self) -> int:
        return len(self.candidates)

    @property
    def unattainable(self) -> int:
        return sum(c.unattainable for c in self.candidates)

    @property
    def pages(self) -> list[AlertRow]:
        """The alerts that fail the run (`cic.pipeline.alerts`)."""
        return [a for a in self.alerts if a.severity == "page"]

    def headline(self) -> str:
        """The worst alert alone, then the others counted by kind: the run's state message and the console's
        first alert line."""
        from cic.pipeline.alerts import headline

        return headline([(a.place.label, a.alert) for a in self.alerts])
