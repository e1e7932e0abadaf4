"""Live gates — single and system — in MLflow's model registry, so a serving system fetches one by name and alias:

    mlflow.artifacts.download_artifacts("models:/<registered name>@live-cp-fixed_sequence-a0p1-d0p05")  # gate.json

One registered model per (model, dataset, estimator, criterion) — what a person looks for — named by a readable
slug plus a hash of that group (two groups never share a name) and tagged with it; one version per gate that
serves answers, so a model's versions are its gates over time, each tagged with its α, δ, bound, search, state and
exact serving key; one alias per configuration, `live-<bound>-<search>-a<α>-d<δ>` ('.' written 'p', '-' written
'm'), on the live gate's version, moved only after the version's tags are checked against the gate. A gate that
serves nothing (α unattainable: no threshold) is never registered, and a key whose live gate serves nothing has
no alias. The store stays the source of truth: `cic gate sync` brings the registry in line after an outage, both
ways, idempotently, and clears the `live` aliases of the per-key names earlier versions registered.

A system gate (a cascade, a model's estimator chosen) sits there the same way, by the same code (`sync_gates`): one
registered model per (system, dataset, criterion), named `cic-system.<slug>.<hash>`, one version per system gate that
serves answers holding every stage's threshold (its tags and `gate/system_gate.json`: the models in order, each
stage's estimator and threshold, the route).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow import MlflowClient

from cic import schema
from cic.pipeline.config import DEFAULT_EXPERIMENT_PREFIX
from cic.pipeline.gates.gate_rows import ColumnReader, GateRow
from cic.pipeline.gates.lifecycle import SERVING_KEY, gate_of
from cic.pipeline.gates.system_gates import ROUTE
from cic.pipeline.run.missing_labels import gate_assumption
from cic.services.mlflow_tracking import experiment_id

LIVE_ALIAS = "live"           # the alias of the per-key registered models earlier versions wrote (cleared)
GATE_ID_TAG = "cic.gate_id"
STATE_TAG = "cic.state"
SERVES = ("serving", "confirmed")  # the serving states that hold the configuration's alias
KEY_TAG = "cic.serving_key"
GROUP_TAG = "cic.group_key"
GROUP_KEY = ("model", "dataset", "estimator", "criterion")
NAME_PREFIX = "cic-gate."
SYSTEM_PREFIX = "cic-system."
SYSTEM_GROUP = ("system", "dataset", "criterion")
SYSTEM_KEY = ("system", "dataset", "criterion", "alpha", "delta", "bound", "search")
_SLUG_MAX = 160


class RegistryMismatch(RuntimeError):
    """A registered model or version does not belong to the gate or serving key it was about to serve."""


def serving_key_json(row: GateRow) -> str:
    """The exact serving key of a gate row as canonical JSON (what the registry's tags are checked against)."""
    return schema.canonical_json({k: (float(row[k]) if k in ("alpha", "delta") else row[k]) for k in SERVING_KEY})


def group_key_json(row: GateRow) -> str:
    """The (model, dataset, estimator, criterion) a registered model holds the gates of, as canonical JSON."""
    return schema.canonical_json({k: row[k] for k in GROUP_KEY})


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text)[:_SLUG_MAX]


def registered_name(row: GateRow) -> str:
    """The registered model of a gate's group: a readable slug (only letters, digits, '.', '_', '=', '-', so it is
    safe to quote in any search) and a hash of the exact group, so two groups never share a name."""
    readable = _slug(f"{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}")
    return f"{NAME_PREFIX}{readable}.{schema.value_hash(group_key_json(row))[:12]}"


def _number(value: float) -> str:
    """A float in an alias, one-to-one: repr's digits with '.' as 'p', '-' as 'm', '+' dropped."""
    return repr(float(value)).replace(".", "p").replace("-", "m").replace("+", "")


def live_alias(row: GateRow) -> str:
    """The alias of a configuration's live gate within its group's registered model (MLflow allows letters,
    digits, '_' and '-'): `live-cp-fixed_sequence-a0p1-d0p05`."""
    names = f"{row['bound']}-{row['search']}"
    if not re.fullmatch(r"[A-Za-z0-9_]+-[A-Za-z0-9_]+", names):  # registry names are; anything else gets a hash
        names = schema.value_hash(names)[:12]
    return f"live-{names}-a{_number(row['alpha'])}-d{_number(row['delta'])}"


def per_key_name(row: GateRow) -> str:
    """The per-serving-key name earlier versions registered (only ever cleared of `live`, never served)."""
    readable = (f"{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}.alpha={row['alpha']:g}"
                f".delta={row['delta']:g}.{row['bound']}.{row['search']}")
    return f"{NAME_PREFIX}{_slug(readable)}.{schema.value_hash(serving_key_json(row))[:12]}"


def legacy_name(row: GateRow) -> str:
    """The name the first versions registered a key under (not injective: only ever cleared, never served)."""
    name = (f"cic-gate.{row['model']}.{row['dataset']}.{row['estimator']}.{row['criterion']}.alpha={row['alpha']:g}"
            f".delta={row['delta']:g}.{row['bound']}.{row['search']}")
    return re.sub(r"[/:]", "_", name)


def serves(row: ColumnReader) -> bool:
    """Whether a gate answers anything: a gate without a threshold (α unattainable) abstains on every question."""
    return row.get("threshold") is not None


def _quoted(value: str) -> str:
    """A string literal for an MLflow filter string; only for values cic builds (slugs, hex ids), which hold no
    quote or backslash — anything else is refused rather than spliced into a search."""
    if not re.fullmatch(r"[A-Za-z0-9._=-]+", value):
        raise ValueError(f"{value!r} is not safe in an MLflow search; registry names and gate ids are slugs")
    return f"'{value}'"


def _gate_run(client: MlflowClient, row: ColumnReader, experiment_prefix: str, tags: dict[str, str],
              files: dict[str, str]) -> Any:
    """The run holding the gate's files (created once per gate, found again by its id)."""
    exp = experiment_id(client, f"{experiment_prefix}-gates")
    found = client.search_runs([exp], filter_string=f"tags.`{GATE_ID_TAG}` = {_quoted(row['calibration_id'])}",
                               max_results=1)
    if found:
        return found[0]
    run = client.create_run(exp, run_name=f"gate {row['calibration_id'][:12]}", tags={
        **tags, "cic.kind": row.get("kind") or "pipeline", **{f"cic.{k}": str(row[k]) for k in (
            "model", "dataset", "estimator", "criterion", "system") if row.get(k) is not None}})
    for path, text in files.items():
        client.log_text(run.info.run_id, text, path)
    client.set_terminated(run.info.run_id, "FINISHED")
    return client.get_run(run.info.run_id)


def _versions(client: MlflowClient, name: str) -> list[Any]:
    return list(client.search_model_versions(f"name = {_quoted(name)}"))


def registry_client(uri: str) -> MlflowClient:
    """A client whose model registry is the tracking store itself (a file or server, not Unity Catalog)."""
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _check_group(model: Any, group: str, name: str) -> None:
    found = (model.tags or {}).get(GROUP_TAG)
    if found != group:
        raise RegistryMismatch(f"registered model {name!r} belongs to {found} but was about to serve a gate of "
                               f"{group}; nothing was moved — rename or delete that registered model")


def _version_tags(row: GateRow) -> dict[str, str]:
    """What a version says of its gate (with the label assumption its certificate rests on), readable in the
    registry UI and checked before an alias moves."""
    return {GATE_ID_TAG: row["calibration_id"], KEY_TAG: serving_key_json(row), "cic.alpha": f"{row['alpha']:g}",
            "cic.delta": f"{row['delta']:g}", "cic.bound": row["bound"], "cic.search": row["search"],
            "cic.threshold": f"{row['threshold']:.6g}", "cic.labels": gate_assumption(row)}


@dataclass(frozen=True)
class RegistryKind:
    """How one kind of gate sits in the registry: its registered model's name and group, whether a row serves,
    the model's tags and description, a version's tags, the run holding its files, and names it replaced."""

    prefix: str
    name: Callable[[GateRow], str]
    group_json: Callable[[GateRow], str]
    serves: Callable[[GateRow], bool]
    model_tags: Callable[[GateRow], dict[str, str]]
    description: Callable[[GateRow], str]
    version_tags: Callable[[GateRow], dict[str, str]]
    files: Callable[[GateRow], dict[str, str]]
    old_names: Callable[[GateRow], set[str]]


def _model_tags(row: GateRow) -> dict[str, str]:
    return {GROUP_TAG: group_key_json(row), **{f"cic.{k}": str(row[k]) for k in GROUP_KEY}}


def _description(row: GateRow) -> str:
    return (f"Certified abstention gates of {row['model']} on {row['dataset']} ({row['estimator']}, "
            f"{row['criterion']}); each version one gate, each alias live-<bound>-<search>-a<α>-d<δ> the live gate "
            "of that configuration.")


def _files(row: GateRow) -> dict[str, str]:
    stored = {k: row[k] for k in schema.SINGLE_GATE_COLUMNS}
    return {"gate/gate.json": gate_of(row).to_json(), "gate/calibration.json": schema.canonical_json(stored)}


SINGLE: RegistryKind = RegistryKind(NAME_PREFIX, registered_name, group_key_json, serves, _model_tags,
                                             _description, _version_tags, _files,
                                             lambda row: {per_key_name(row), legacy_name(row)})


def system_group_json(row: GateRow) -> str:
    """The (system, dataset, criterion) a registered model holds the gates of, with the system's models."""
    return schema.canonical_json({**{k: row[k] for k in SYSTEM_GROUP}, "models": list(row["models"])})


def system_key_json(row: GateRow) -> str:
    """A system gate's exact serving key as canonical JSON (what its version's tags are checked against)."""
    return schema.canonical_json({k: (float(row[k]) if k in ("alpha", "delta") else row[k]) for k in SYSTEM_KEY}
                                 | {"models": list(row["models"])})


def system_registered_name(row: GateRow) -> str:
    """`cic-system.<system>.<dataset>.<criterion>.<hash of the group>`: readable, and two groups never share it."""
    readable = _slug(f"{row['system']}.{row['dataset']}.{row['criterion']}")
    return f"{SYSTEM_PREFIX}{readable}.{schema.value_hash(system_group_json(row))[:12]}"


def _thresholds(row: GateRow) -> str:
    return json.dumps([None if t is None else float(t) for t in row["thresholds"]])


def _system_version_tags(row: GateRow) -> dict[str, str]:
    return {GATE_ID_TAG: row["calibration_id"], KEY_TAG: system_key_json(row), "cic.alpha": f"{row['alpha']:g}",
            "cic.delta": f"{row['delta']:g}", "cic.bound": row["bound"], "cic.search": row["search"],
            "cic.models": " -> ".join(row["models"]), "cic.estimators": " / ".join(row["estimators"] or []),
            "cic.thresholds": _thresholds(row), "cic.labels": gate_assumption(row)}


def _system_files(row: GateRow) -> dict[str, str]:
    gate = {"gate_id": row["calibration_id"], **{k: row[k] for k in SYSTEM_KEY}, "kind": row["system_kind"],
            "models": list(row["models"]), "estimators": list(row["estimators"] or []),
            "thresholds": json.loads(_thresholds(row)), "guarantee": row["guarantee"], "route": ROUTE,
            **{k: row[k] for k in ("bound_value", "n_accepted", "n_errors", "n_cal")},
            "shares": list(row["shares"] or []), "questions": len(row["question_ids"] or [])}
    return {"gate/system_gate.json": schema.canonical_json(gate)}


SYSTEM: RegistryKind = RegistryKind(
    SYSTEM_PREFIX, system_registered_name, system_group_json, lambda row: bool(row["certified"]),
    lambda row: {GROUP_TAG: system_group_json(row), "cic.system": row["system"], "cic.dataset": row["dataset"],
                 "cic.criterion": row["criterion"], "cic.models": " -> ".join(row["models"])},
    lambda row: (f"Certified system gates of {row['system']} ({' -> '.join(row['models'])}) on {row['dataset']} "
                 f"({row['criterion']}); each version one gate with every stage's threshold, each alias "
                 "live-<bound>-<search>-a<α>-d<δ> the live gate of that configuration."),
    _system_version_tags, _system_files, lambda row: set())


def registry_kind(row: GateRow) -> RegistryKind:
    """How a gate is registered: as a system's (a cascade, an estimator chosen) or as a single model's."""
    return SYSTEM if row.is_system else SINGLE


def _sync_group(client: MlflowClient, rows: list[GateRow], experiment_prefix: str,
                existing: dict[str, Any], kind: RegistryKind) -> list[str]:
    """One group's registered model: a version per serving gate (tagged with its state), and per configuration
    the alias on the live gate's version (after checking the version's tags name that gate and key) or no alias
    when no serving gate is live. Returns 'name@alias' for each alias that points somewhere."""
    name = kind.name(rows[0])
    group = kind.group_json(rows[0])
    serving = [r for r in rows if kind.serves(r)]
    model = existing.get(name)
    if model is None and not serving:
        return []  # nothing answers: nothing to register
    if model is None:
        model = client.create_registered_model(name, tags=kind.model_tags(rows[0]),
                                               description=kind.description(rows[0]))
    _check_group(model, group, name)
    by_gate = {v.tags.get(GATE_ID_TAG): v for v in _versions(client, name)} if existing.get(name) else {}
    aliases = dict(getattr(model, "aliases", None) or {})
    wanted: dict[str, str] = {}
    withdrawn: set[str] = set()  # versions of withdrawn gates: no alias may point at them, whatever its name
    for row in sorted(serving, key=lambda r: r["state"] == "live"):
        tags, state = kind.version_tags(row), registry_state(row)
        version = by_gate.get(row["calibration_id"])
        if version is None:
            run = _gate_run(client, row, experiment_prefix, tags, kind.files(row))
            version = client.create_model_version(name, f"{run.info.artifact_uri}/gate", run_id=run.info.run_id,
                                                  tags={**tags, STATE_TAG: state}, await_creation_for=0)
        elif version.tags.get(STATE_TAG) != state:
            client.set_model_version_tag(name, version.version, STATE_TAG, state)
        if state == "withdrawn":  # its row may be the edited one: only take its aliases away
            withdrawn.add(str(version.version))
            continue
        if version.tags.get(KEY_TAG) != tags[KEY_TAG] or version.tags.get(GATE_ID_TAG) != row["calibration_id"]:
            raise RegistryMismatch(f"{name} version {version.version} is tagged gate "
                                   f"{version.tags.get(GATE_ID_TAG)!r}, key {version.tags.get(KEY_TAG)!r}, not gate "
                                   f"{row['calibration_id']!r} of {tags[KEY_TAG]}; nothing was moved")
        if state in SERVES:
            wanted[live_alias(row)] = str(version.version)
    for row in rows:  # a configuration whose live gate serves nothing (or is flagged), or that has none: no alias
        wanted.setdefault(live_alias(row), "")
    for alias, number in aliases.items():  # an alias on a withdrawn version goes, even under another key's name
        if str(number) in withdrawn and not wanted.get(alias):
            wanted[alias] = ""
    out = []
    for alias, version_number in wanted.items():
        current = aliases.get(alias)
        if version_number and str(current) != version_number:
            client.set_registered_model_alias(name, alias, version_number)
        elif not version_number and current is not None:
            client.delete_registered_model_alias(name, alias)
        if version_number:
            out.append(f"{name}@{alias}")
    for row in rows:  # names earlier versions served this key under: they serve nothing now
        for old in kind.old_names(row):
            found = existing.get(old)
            if found is not None and LIVE_ALIAS in (found.aliases or {}) and \
                    (found.tags or {}).get(KEY_TAG) is not None and \
                    json.loads(found.tags[KEY_TAG]) == json.loads(serving_key_json(row)):
                client.delete_registered_model_alias(old, LIVE_ALIAS)
    return out


def registry_state(row: ColumnReader) -> str:
    """A version's `cic.state` tag: the gate's serving state in the words every surface uses
    (`cic.pipeline.gates.serving_state`): serving, confirmed, withdrawn (no alias until a newer gate is promoted or a
    person confirms it), candidate, unattainable, retired."""
    from cic.pipeline.gates.serving_state import serving_state

    return serving_state(row).word


def registered_gate_models(client: MlflowClient, prefix: str = NAME_PREFIX) -> dict[str, Any]:
    """Every registered model cic named (`cic-gate.…`, or `prefix`), with its tags and aliases, in one paged
    search."""
    found: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_registered_models(filter_string=f"name LIKE {_quoted(prefix)[:-1]}%'", max_results=1000,
                                               page_token=token)
        found.update({m.name: m for m in page})
        token = page.token
        if not token:
            return found


def sync_gates(client: MlflowClient, rows: Sequence[GateRow], *,
               experiment_prefix: str = DEFAULT_EXPERIMENT_PREFIX,
               progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Register each serving gate, single or system (with its state), and reconcile each configuration's alias with
    the store: on the live gate's version, or absent when no serving gate is live; returns 'name@alias' of each
    live alias."""
    by_group: dict[tuple[RegistryKind, str], list[Any]] = {}
    for row in rows:
        kind = registry_kind(row)
        by_group.setdefault((kind, kind.group_json(row)), []).append(row)
    existing: dict[str, Any] = {}
    for prefix in sorted({kind.prefix for kind, _ in by_group}):
        existing |= registered_gate_models(client, prefix)
    out = []
    for done, ((kind, _), group_rows) in enumerate(by_group.items(), 1):
        out.extend(_sync_group(client, group_rows, experiment_prefix, existing, kind))
        if progress is not None:
            progress(done, len(by_group))
    return out
