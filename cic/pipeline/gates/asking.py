"""`cic ask`: answer one new question with the live gate, or abstain, showing the score and the threshold."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError

if TYPE_CHECKING:
    from cic.pipeline.gates.gate_rows import GateRow


@dataclass(frozen=True)
class Reply:
    """The decision for one question, with what it rests on."""

    decision: str
    answer: str
    score: float | None  # None: not computed (the key's gate serves nothing, so no model was asked)
    threshold: float | None
    estimator: str
    calibration_id: str
    withheld: str | None = None  # why the key's gate serves nothing (unattainable, flagged, no guarantee)
    alpha: float | None = None   # the gate's alpha (the config's when --alpha was not given)
    generations: int | None = None  # answers generated for the score (1 one-pass; fewer than 11 under adaptive rounds)


def question_row(question: str, dataset: str, choices: Sequence[str] | None) -> pl.DataFrame:
    """A one-row QUESTIONS frame for a user's question (multiple choice when options are given)."""
    if not question.strip():
        raise UserError("question = '': ask something")
    labels = [chr(ord("A") + i) for i in range(len(choices))] if choices else None
    return schema.conform(pl.DataFrame({
        "dataset": [dataset], "split": ["ask"], "question_id": ["ask-" + schema.value_hash(question, choices)[:12]],
        "question": [question], "choices": [list(choices) if choices else None], "choice_labels": [labels],
        "answer": [""], "aliases": [[]]}, schema=schema.QUESTIONS.schema), schema.QUESTIONS)


def shown_answer(answer: str, choices: Sequence[str] | None) -> str:
    """An answer as a person reads it: a multiple-choice answer as its letter and the option's text ("B (Paris)"),
    any other as it is."""
    labels = [chr(ord("A") + i) for i in range(len(choices))] if choices else []
    if answer.strip() in labels:
        letter = answer.strip()
        return f"{letter} ({choices[labels.index(letter)]})" if choices else letter
    return answer


def serving_gate(db: str, *, model: str, dataset: str, estimator: str, criterion: str | None, alpha: float,
                 bound: str, search: str) -> GateRow:
    """The live gate of that key (`cic.pipeline.gates.serving.live_gate`), read without locking the store."""
    from cic.pipeline.gates.serving import live_gate
    from cic.store import Store

    with Store.open(db, read_only=True, wait_s=60) as store:
        return live_gate(store, model=model, dataset=dataset, estimator=estimator, criterion=criterion,
                         alpha=alpha, bound=bound, search=search)


def stored_generation_config(db: str, run_key: str) -> dict[str, Any] | None:
    """What shaped a gate's answers, as its run row keeps it (None: no such run)."""
    from cic.store import Store

    with Store.open(db, read_only=True, wait_s=60) as store:
        runs = store.read("runs", run_key=run_key)
    return json.loads(runs.get_column("generation_config")[0]) if runs.height else None


def certified_identity(db: str, run_key: str, engine: str) -> str | None:
    """The identity a gate's answers were generated under (a served model: what its server said it serves),
    read from its run key's row as its engine wrote it; None where the spec alone keys the run."""
    from cic.llm.engines import engine_class

    stored = stored_generation_config(db, run_key)
    return None if stored is None else engine_class(engine).certified_identity(stored)


# what a served model's probe observes (engine, log-probability semantics, identity-check answer): keyed only since
# runs recorded them, so a gate certified before is compared on the rest
SERVED_LATER = ("endpoint_engine", "logprobs_as", "endpoint_canary", "option_probs_from")


def same_generation_settings(model: str, ours: dict[str, Any], certified: dict[str, Any] | None) -> None:
    """Refuse, in one line naming each setting that differs, a config whose generation settings (temperature,
    samples, tokens, seed, dtype, ...) are not those the gate's run was keyed on: its threshold was certified on
    scores of answers generated that way. Runs cic did not generate (ingested traffic, imported tables) say
    nothing about settings and are not compared."""
    if certified is None or "source" in certified:
        return
    ours, certified = json.loads(schema.canonical_json(ours)), json.loads(schema.canonical_json(certified))
    keys = (set(ours) | set(certified)) - {k for k in SERVED_LATER if k not in certified}
    differ = [k for k in sorted(keys) if ours.get(k) != certified.get(k)]
    served = [k for k in differ if k in SERVED_LATER]
    if served:
        said = "; ".join(f"{k} = {ours.get(k)!r} now, {certified.get(k)!r} certified" for k in served)
        raise UserError(f"model {model!r}: the endpoint no longer behaves as when its gate was certified ({said}); "
                        "another engine or other weights answer under its name: `cic run` against it and promote "
                        "its gate")
    if differ:
        said = "; ".join(f"{k} = {ours.get(k)!r} in this config, {certified.get(k)!r} certified" for k in differ)
        raise UserError(f"model {model!r}: the config's generation settings are not those its gate was certified "
                        f"under ({said}); ask with the settings the gate was certified with, or `cic run` this "
                        "config and promote its gate")


def ask_question(question: str, *, config_path: str | Path, db: str | None, model: str | None, dataset: str,
                 choices: Sequence[str] | None, estimator: str, criterion: str | None, alpha: float | None,
                 bound: str, search: str, say: Callable[[str], None] = lambda line: None) -> Reply:
    """Find the gate (alpha and criterion default to the config's), check that this config can compute its score,
    then — only then, and only when the gate serves — generate the answer with the config's model, score it and
    apply the gate. A gate that serves nothing abstains without loading a model. `say` hears what loads before it
    does (a model takes seconds to a minute)."""
    from cic.pipeline.config import load_config
    from cic.pipeline.gates.lifecycle import gate_of

    config = load_config(config_path)
    names = [m.name for m in config.models]
    index = names.index(model) if model in names else 0
    if model is not None and model not in names:
        raise UserError(f"model = {model!r}: not in the config; choose from {names}")
    store_path = db or config.storage.db
    criterion = criterion or configured_criterion(config, dataset)
    if alpha is None:
        alpha = default_alpha(store_path, config.calibration.alphas, model=names[index], dataset=dataset,
                              estimator=estimator, criterion=criterion, bound=bound, search=search)
    gate_row = serving_gate(store_path, model=names[index], dataset=dataset, estimator=estimator,
                            criterion=criterion, alpha=alpha, bound=bound, search=search)
    same_settings = reachable_as_certified(config, index, store_path, gate_row.run_key)  # one request, no load
    why = gate_row.withheld
    if why is not None:  # a gate out of service answers nothing: no model is loaded to find that out
        return Reply("abstain", "", None, None, gate_row.estimator, gate_row.calibration_id, why, alpha)
    askable_estimator(config, gate_row.estimator, gate_row.calibration_id)
    askable_dataset(dataset, gate_row.calibration_id, store_path)
    same_settings()
    chosen = config.models[index]
    say(f"gate {gate_row.calibration_id[:12]} serves (score {gate_row.estimator}); loading {chosen.name} "
        f"({chosen.spec or 'its endpoint'}) to answer and score …")
    answer, score, generations = answer_and_score(config, index, store_path, gate_row.run_key,
                                                  gate_row.estimator, question_row(question, dataset, choices))
    return Reply(gate_of(gate_row).decide(score), answer, score, gate_row.threshold, gate_row.estimator,
                 gate_row.calibration_id, None, alpha, generations)


def askable_dataset(dataset: str, gate_id: str, db: str) -> None:
    """Refuse, before any model loads, a gate of a production stream (a `dataset` no registry entry describes):
    `cic ask` would not know the prompt the served system's answers were given, so its answer and score would
    not be those the gate was certified on. Such gates serve from the export, where the served system's own scores
    meet them."""
    from cic.data import DATASETS
    from cic.pipeline.gates.serving_state import gate_command

    if dataset in DATASETS:
        return
    raise UserError(f"dataset = {dataset!r}: gate {gate_id[:12]} certifies a production stream, not a registered "
                    "dataset, so cic ask does not know the prompt its answers were given and cannot answer as the "
                    f"served system does; serve it from {gate_command('export', None, db, '--out', 'live-gates.json')},"
                    " where the served system's own scores meet its threshold")


def reachable_as_certified(config: Any, index: int, db: str, run_key: str) -> Callable[[], None]:
    """Probe the model's engine (a served model answers which model it is; local weights are not loaded) and refuse,
    in one line, one that is down or serves another model than the gate's run was keyed on. Returns the check that
    the config would generate under the certified settings (`same_generation_settings`), run once the gate is known
    to serve."""
    from cic.llm.engines import engine_class

    settings = config.answerer_settings(index)
    engine = engine_class(settings.engine)
    stored = stored_generation_config(db, run_key)
    expected = None if stored is None else engine.certified_identity(stored)
    try:
        probe = engine.probe(settings)
    except UserError as exc:
        raise UserError(f"model {config.models[index].name!r}: {exc}") from None
    served = probe.identity
    if expected is not None and served is not None and served != expected:
        raise UserError(f"model {settings.model_spec}: the endpoint now serves {served!r}, but this run is keyed on "
                        f"{expected!r}; start a new run for the new model")
    return lambda: same_generation_settings(config.models[index].name, engine.run_key(settings, probe), stored)


def configured_criterion(config: Any, dataset: str) -> str | None:
    """The config's criterion for the dataset (its first), or None: the dataset's default."""
    for entry in config.datasets:
        if entry.name == dataset and entry.criteria:
            return str(entry.criteria[0])
    return None


def default_alpha(db: str, alphas: Sequence[float], *, model: str, dataset: str, estimator: str,
                  criterion: str | None, bound: str, search: str) -> float:
    """`cic ask` without --alpha: the config's alpha when it has one; else the strictest configured alpha whose
    gate serves for this key (the largest when none does, so the miss lists what serves)."""
    from cic.pipeline.gates.gate_rows import gate_rows
    from cic.pipeline.gates.lifecycle import gates
    from cic.pipeline.gates.serving_state import serving_state
    from cic.store import Store

    if len(alphas) == 1:
        return float(alphas[0])
    with Store.open(db, read_only=True, wait_s=60) as store:
        live = gates(store, model=model, dataset=dataset, bound=bound, search=search).filter(
            (pl.col("state") == "live") & ((pl.col("estimator") == estimator)
                                          | (schema.estimator_base_column() == estimator)))
    if criterion:
        live = live.filter(criterion=criterion)
    serving = {round(r.alpha, 12) for r in gate_rows(live) if serving_state(r).serves}
    chosen = [a for a in sorted(alphas) if round(float(a), 12) in serving]
    return float(chosen[0] if chosen else max(alphas))


def askable_estimator(config: Any, stored: str, gate_id: str) -> None:
    """Refuse, before any model loads, a gate whose score this config cannot compute under the name the gate was
    certified on (an ingested `score:<name>` column is stored as written): one line with the spelling it can."""
    from cic.llm.probes import parse_estimator
    from cic.llm.uncertainty.estimators import ESTIMATORS
    from cic.pipeline.run.score_names import computed_name

    if parse_estimator(stored) is not None:  # a probe reads the states the greedy pass keeps
        if not config.generation.keep_hidden:
            raise UserError(f"gate {gate_id[:12]} thresholds probe score {stored!r}, which reads kept hidden "
                            "states; ask with the config its run used (generation.keep_hidden)")
        return
    computed = computed_name(config.uncertainty, stored, config.generation.adaptive)
    if computed is None:
        raise UserError(f"gate {gate_id[:12]} thresholds score {stored!r}, which no estimator computes "
                        f"(estimators: {', '.join(ESTIMATORS)}); `cic ask` cannot score a new question for it — "
                        "serve it where that score is computed (`cic gate export`)")
    if computed != stored:
        raise UserError(f"gate {gate_id[:12]} thresholds score {stored!r}, but this config computes "
                        f"{stored.split('[')[0]} as "
                        f"{computed!r} (uncertainty.equivalence, its threshold and generation.adaptive shape it); "
                        "ingest the score "
                        f"column as `score:{computed}` and recalibrate, or ask with a config whose uncertainty "
                        "settings give that name")


def answer_and_score(config: Any, index: int, db: str, run_key: str, estimator: str,
                     questions: pl.DataFrame) -> tuple[str, float, int]:
    """Model number `index` of the config answers the one question and scores it with `estimator` (stored name):
    (answer, score, generations drawn). A one-pass score draws the most likely answer alone; adaptive rounds
    (`generation.adaptive`) stop as the run's did. Its engine refuses a model other than the one the gate's run was
    generated with."""
    from dataclasses import replace

    from cic.llm.answering import Answerer, generations_drawn
    from cic.llm.engines import EngineProbe
    from cic.llm.probes import parse_estimator
    from cic.llm.uncertainty.estimators import get_estimator
    from cic.pipeline.run.probe_stage import probe_score

    name, probed = config.models[index].name, parse_estimator(estimator) is not None
    settings = config.answerer_settings(index)
    # the gate holds only for the model it was certified on: the engine probes and refuses another
    expected = certified_identity(db, run_key, settings.engine)
    settings = replace(settings, estimators=("answer_nll",) if probed else (schema.estimator_base(estimator),),
                       probe=EngineProbe(identity=expected) if expected is not None else None)
    answerer = Answerer(settings)
    one_pass = probed or get_estimator(schema.estimator_base(estimator)).one_pass
    generations = answerer.generate(questions, run_key="ask", only_most_likely=one_pass)
    if failures := answerer.engine.take_failures():
        raise UserError(f"model {name}: the endpoint gave no answer ({next(iter(failures.values()))})")
    if probed:  # the probe fitted on the run's states scores the one greedy pass
        return (generations.filter(sample_index=0).get_column("text")[0],
                probe_score(db, run_key, estimator, generations), generations_drawn(generations))
    scores = answerer.scorer.score(generations, run_key="ask").filter(estimator=estimator)
    if scores.height == 0 or scores.get_column("value")[0] is None:
        raise UserError(f"estimator {estimator!r} gives no score for this question")
    return (generations.filter(sample_index=0).get_column("text")[0], float(scores.get_column("value")[0]),
            generations_drawn(generations))


@dataclass(frozen=True)
class CascadeReply:
    """A cascade's decision for one question: who answered (None: every stage declined), and per stage asked its
    score against its threshold; stages after the answering one were never called."""

    decision: str
    answer: str
    answered_by: str | None
    steps: tuple[tuple[str, float | None, float | None], ...]  # (model, score or None: not called, threshold)
    calibration_id: str
    estimators: tuple[str, ...]
    models: tuple[str, ...]
    alpha: float | None = None
    withheld: str | None = None  # why the system's gate serves nothing (unattainable, flagged)

    @property
    def not_called(self) -> tuple[str, ...]:
        """The stages after the answering one: never asked."""
        return self.models[len(self.steps):]


def ask_cascade(question: str, *, config_path: str | Path, db: str | None, cascade: str, dataset: str,
                choices: Sequence[str] | None, criterion: str | None, alpha: float | None,
                bound: str) -> CascadeReply:
    """Ask the cascade's models in order with its stored (re-certified) gate: the first whose score is within its
    threshold answers and no later model is called; a stage without a threshold is skipped; none: abstain. Alpha
    defaults to the strictest configured alpha whose gate serves; every stage's score is checked computable
    before any model loads."""
    from cic.pipeline.config import load_config
    from cic.pipeline.gates.serving import live_gate
    from cic.store import Store

    config = load_config(config_path)
    names = {c.name for c in config.calibration.cascades}
    if cascade not in names:
        raise UserError(f"cascade = {cascade!r}: not in the config's calibration.cascades "
                        f"({', '.join(sorted(names)) or 'none'})")
    store_path = db or config.storage.db
    criterion = criterion or configured_criterion(config, dataset)
    tried = sorted(config.calibration.alphas) if alpha is None else [alpha]
    found: list[tuple[float, Any]] = []  # (alpha, its gate), strictest first, until one serves
    with Store.open(store_path, read_only=True, wait_s=60) as store:
        for level in tried:
            try:
                found.append((level, live_gate(store, system=cascade, dataset=dataset, criterion=criterion,
                                               alpha=level, bound=bound)))
            except UserError:
                if not found and level == tried[-1]:
                    raise
                continue
            if found[-1][1].withheld is None:
                break
    alpha, row = next(((a, r) for a, r in found if r.withheld is None), found[0])  # else the strictest, withheld
    if row.withheld is not None:  # out of service: abstain naming why, no model loaded
        return CascadeReply("abstain", "", None, (), row["calibration_id"], tuple(row["estimators"] or ()),
                            tuple(row["models"]), alpha, row.withheld)
    for stage, name in enumerate(row["estimators"] or []):
        if row["thresholds"][stage] is not None:
            askable_estimator(config, name, row["calibration_id"])
    configured = next(c for c in config.calibration.cascades if c.name == cascade)
    if list(configured.models) != row["models"]:
        raise UserError(f"cascade {cascade!r}: the config's {' -> '.join(configured.models)} is not the system "
                        f"certified ({' -> '.join(row['models'])}); run `cic run` to certify it")
    models = [m.name for m in config.models]
    questions = question_row(question, dataset, choices)
    steps: list[tuple[str, float | None, float | None]] = []
    last = ""
    for stage, (model, threshold) in enumerate(zip(row["models"], row["thresholds"], strict=True)):
        if threshold is None or not row["estimators"]:  # this stage never answers: not called
            steps.append((model, None, None))
            continue
        # before this stage's model is loaded or asked (a later stage is called only if reached)
        reachable_as_certified(config, models.index(model), store_path, row["run_keys"][stage])()
        last, score, _ = answer_and_score(config, models.index(model), store_path, row["run_keys"][stage],
                                       row["estimators"][stage], questions)
        steps.append((model, score, threshold))
        if score <= threshold:
            return CascadeReply("answer", last, model, tuple(steps), row["calibration_id"],
                                tuple(row["estimators"]), tuple(row["models"]), alpha)
    return CascadeReply("abstain", last, None, tuple(steps), row["calibration_id"], tuple(row["estimators"]),
                        tuple(row["models"]), alpha)
