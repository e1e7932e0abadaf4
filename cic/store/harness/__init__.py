"""Evaluation outputs other tools wrote, read as the long (score, error) table `cic calibrate / evaluate / report /
log` take: one module per harness, each a `Harness` in HARNESSES (a new harness is one file and one line)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cic.errors import UserError
from cic.registry import Registry
from cic.store.harness.contract import guarded

if TYPE_CHECKING:
    import polars as pl


def _claims_nothing(path: Path) -> bool:
    return False


@dataclass(frozen=True)
class Harness:
    """`looks_like(row)`: whether one record (a JSON object of the file) is this harness's output; `read(path)`: the
    long table (model, dataset, estimator, criterion, score, error, question_id, source); `claims(path)`: whether a
    path is this harness's by its name or layout alone (a run directory, an archive) before any record is read."""

    name: str
    label: str
    looks_like: Callable[[dict[str, Any]], bool]
    read: Callable[[Path], pl.DataFrame]
    claims: Callable[[Path], bool] = _claims_nothing


def _lm_eval() -> Harness:
    from cic.store.harness import lm_eval

    label = "lm-evaluation-harness --log_samples"
    return Harness("lm-eval", label, lm_eval.looks_like, guarded(lm_eval.read, label))


def _inspect_ai() -> Harness:
    from cic.store.harness import inspect_ai

    label = "an inspect-ai evaluation log (JSON)"
    return Harness("inspect-ai", label, inspect_ai.looks_like, guarded(inspect_ai.read, label), inspect_ai.claims)


def _helm() -> Harness:
    from cic.store.harness import helm

    label = "a HELM run directory (scenario_state.json + per_instance_stats.json)"
    return Harness("helm", label, helm.looks_like, guarded(helm.read, label), helm.claims)


def _lighteval() -> Harness:
    from cic.store.harness import lighteval

    label = "lighteval --save-details output (details_*.parquet)"
    return Harness("lighteval", label, lighteval.looks_like, guarded(lighteval.read, label), lighteval.claims)


HARNESSES: Registry[Harness] = Registry("harness", (_lm_eval(), _inspect_ai(), _helm(), _lighteval()),
                                        base=Harness, group="cic.harnesses")


def which_harness(record: dict[str, Any]) -> Harness | None:
    """The harness whose output a record is (None: none known)."""
    return next((h for h in HARNESSES.values() if h.looks_like(record)), None)


def read_harness(path: str | Path, harness: str | None = None) -> pl.DataFrame:
    """The long table of a harness's output file (or a directory of them); the harness named, or recognised
    from the file's first record."""
    p = Path(path).expanduser()
    if p.is_symlink() and not p.exists():
        raise UserError(f"file = {str(p)!r}: a symbolic link that leads nowhere (a loop, or a missing target)")
    if not p.exists():
        raise UserError(f"file = {str(p)!r}: does not exist")
    if harness is not None:
        return HARNESSES.lookup(harness).read(p)
    found = harness_at(p)
    if found is None:
        raise UserError(f"file = {str(p)!r}: not an evaluation output CIC reads (known: "
                        f"{', '.join(h.label for h in HARNESSES.values())}); name one with --harness")
    return found.read(p)


def harness_at(path: Path) -> Harness | None:
    """The harness whose output a path is: claimed by its name or layout, else recognised from its first record;
    None for anything else (a score table)."""
    claimed = [h for h in HARNESSES.values() if h.claims(path)]
    if len(claimed) > 1:
        raise UserError(f"file = {str(path)!r}: holds the outputs of {' and '.join(h.name for h in claimed)}; give "
                        "one harness's folder at a time")
    if claimed or (path.is_file() and path.suffix.lower() not in (".json", ".jsonl")):
        return claimed[0] if claimed else None
    first = _first_record(path)
    return which_harness(first) if first is not None else None


def _first_record(p: Path) -> dict[str, Any] | None:
    """The first JSON object of a JSON-lines output (lm-eval), or the whole document of a JSON log (inspect-ai)."""
    import json

    logs = sorted(p.glob("**/*.json")) if p.is_dir() and not any(p.glob("**/samples_*.jsonl")) else []
    if p.suffix == ".json" or logs:
        try:
            record = json.loads((logs[0] if logs else p).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None
    files = sorted(p.glob("**/samples_*.jsonl")) if p.is_dir() else [p]
    for file in files:
        with file.open("rb") as handle:
            for line in handle:
                if line.strip():
                    try:
                        record = json.loads(line)
                    except ValueError:
                        return None
                    return record if isinstance(record, dict) else None
    return None
