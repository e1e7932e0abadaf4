"""Stanford CRFM HELM run directories (`benchmark_output/runs/<suite>/<run>/`) as (question, score, error) rows,
read as JSON (crfm-helm itself conflicts with CIC's `datasets` pin).

- The answer and its confidence: `scenario_state.json` holds each request's completion with one log-probability
  per generated token; the score is `one_minus_answer_prob` = 1 − exp(Σ token log-probabilities), the probability
  the model gave its own (greedy) answer. A run whose every token log-probability is 0 (an API that returned
  none) is refused: it has no score to certify.
- Correctness: `per_instance_stats.json` holds HELM's per-instance metrics; each of `exact_match`,
  `quasi_exact_match`, `prefix_exact_match` and `quasi_prefix_exact_match` present is a criterion, error = 1 − its
  value on the instance's own split (perturbed copies are left out).
- Provenance: the model is the adapter spec's, the dataset the run name without its `model=` argument
  (`bbq:subject=all,method=multiple_choice_joint`), the source "HELM <suite> run <name>"."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.store.harness.contract import Once, log_probabilities

if TYPE_CHECKING:
    import polars as pl

ESTIMATOR = "one_minus_answer_prob"
CRITERIA = ("exact_match", "quasi_exact_match", "prefix_exact_match", "quasi_prefix_exact_match")
STATE = "scenario_state.json"
STATS = "per_instance_stats.json"


def looks_like(record: dict[str, Any]) -> bool:
    """A `scenario_state.json` document."""
    return isinstance(record.get("request_states"), list) and isinstance(record.get("adapter_spec"), dict)


def claims(path: Path) -> bool:
    """A run directory, a suite of them, or a run's `scenario_state.json`."""
    return path.name == STATE or (path.is_dir() and any(path.glob(f"**/{STATE}")))


def read(path: Path) -> pl.DataFrame:
    import polars as pl

    runs = [path.parent] if path.name == STATE else sorted(p.parent for p in path.glob(f"**/{STATE}"))
    if not runs:
        raise UserError(f"file = {str(path)!r}: holds no HELM run directory (no {STATE} below it)")
    return pl.concat([_read_run(run) for run in runs])


def _load(path: Path) -> Any:
    if not path.exists():
        raise UserError(f"file = {str(path)!r}: missing; a HELM run directory holds {STATE} and {STATS}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"file = {str(path)!r}: not a JSON document (a truncated file?)") from None


def _read_run(run: Path) -> pl.DataFrame:
    import polars as pl

    state = _load(run / STATE)
    if not isinstance(state, dict) or not looks_like(state):
        raise UserError(f"file = {str(run / STATE)!r}: no adapter_spec and request_states (a file from another "
                        "HELM version?)")
    model = str(state["adapter_spec"].get("model") or run.name.rpartition("model=")[2])
    name = _run_name(run)
    source = f"HELM {run.parent.name} run {name}" if run.parent.parent.name == "runs" else f"HELM run {name}"
    scores = {key: _score(request, run) for key, request in _requests(state, run).items()}
    if all(value == 1.0 for value in scores.values()):  # exp(0): no token carried a log-probability
        raise UserError(f"file = {str(run / STATE)!r}: every token log-probability is 0 (the model's API returned "
                        "none): HELM stored no score to certify for this run")
    correct = _correctness(_load(run / STATS), run)
    several_trials = len({trial for _, trial in scores}) > 1
    rows = []
    for (instance, trial), score in scores.items():
        if (instance, trial) not in correct:
            raise UserError(f"file = {str(run / STATS)!r}: no {'/'.join(CRITERIA)} for instance {instance!r}")
        question = f"{instance}#{trial}" if several_trials else instance
        rows.extend({"model": model, "dataset": _dataset(name), "estimator": ESTIMATOR, "criterion": criterion,
                     "score": 1.0 - score, "error": 1 - value, "question_id": question, "source": source}
                    for criterion, value in correct[(instance, trial)].items())
    return pl.DataFrame(rows, schema={"model": pl.String, "dataset": pl.String, "estimator": pl.String,
                                      "criterion": pl.String, "score": pl.Float64, "error": pl.Int8,
                                      "question_id": pl.String, "source": pl.String})


def _run_name(run: Path) -> str:
    spec = run / "run_spec.json"
    if spec.exists():
        named = _load(spec)
        if isinstance(named, dict) and isinstance(named.get("name"), str):
            return named["name"]
    return run.name


def _dataset(name: str) -> str:
    """The run name without its model argument: the scenario and its settings."""
    scenario, _, args = name.partition(":")
    kept = [arg for arg in args.split(",") if arg and not arg.startswith("model=")]
    return f"{scenario}:{','.join(kept)}" if kept else scenario


def _requests(state: dict[str, Any], run: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (instance id, train trial)'s request state; one per key (perturbed copies left out)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    once = Once("instance (and train trial)")
    for number, request in enumerate(state["request_states"]):
        instance = request.get("instance") if isinstance(request, dict) else None
        if not isinstance(instance, dict) or "id" not in instance or "result" not in request:
            raise UserError(f"file = {str(run / STATE)!r}: request_states[{number}] has no instance id or result")
        if instance.get("perturbation"):
            continue
        key = (str(instance["id"]), int(request.get("train_trial_index", 0)))
        once.add(key, f"file = {str(run / STATE)!r}, request_states[{number}]")
        out[key] = request
    return out


def _score(request: dict[str, Any], run: Path) -> float:
    """The probability of the completion's tokens, exp(Σ log-probabilities)."""
    result = request["result"] or {}
    where = f"file = {str(run / STATE)!r}, instance {request['instance']['id']!r}"
    if not result.get("success", True):
        raise UserError(f"{where}: the request failed ({str(result.get('error'))[:80]}); HELM has no answer to score")
    completions = result.get("completions") or []
    tokens = completions[0].get("tokens") if completions and isinstance(completions[0], dict) else None
    if not tokens:
        raise UserError(f"{where}: the completion has no tokens with log-probabilities")
    if not all(isinstance(token, dict) and "logprob" in token for token in tokens):
        raise UserError(f"{where}: a token without a numeric logprob")
    total = sum(log_probabilities([token["logprob"] for token in tokens], where, "completions[0].tokens.logprob"))
    return math.exp(total)


def _correctness(stats: Any, run: Path) -> dict[tuple[str, int], dict[str, int]]:
    """Each (instance, trial)'s 0/1 value of every criterion present, on its own split, unperturbed."""
    if not isinstance(stats, list):
        raise UserError(f"file = {str(run / STATS)!r}: not a list of per-instance stats")
    out: dict[tuple[str, int], dict[str, int]] = {}
    once = Once("criterion of instance (and train trial)")
    for number, entry in enumerate(stats):
        if not isinstance(entry, dict):
            raise UserError(f"file = {str(run / STATS)!r}: entry {number} is not an object")
        key = (str(entry.get("instance_id")), int(entry.get("train_trial_index", 0)))
        for stat in entry.get("stats") or []:
            name = stat.get("name") or {}
            if name.get("name") not in CRITERIA or name.get("perturbation"):
                continue
            value = stat.get("mean", stat.get("sum"))
            if value not in (0, 1):
                raise UserError(f"file = {str(run / STATS)!r}: {name.get('name')} = {value!r} for instance "
                                f"{key[0]!r} is not 0 or 1")
            once.add((*key, name["name"]), f"file = {str(run / STATS)!r}, entry {number}")
            out.setdefault(key, {})[name["name"]] = int(value)
    return out
