"""Check a pipeline config before any service starts: the YAML, and that every file, model and dataset it
names exists (nothing is loaded). `cic run` and `cic recalibrate` call it first, so a typo costs a second and
one line, not a Prefect server start and a traceback."""

from __future__ import annotations

from pathlib import Path

from cic.data.sources import HUB_ID
from cic.errors import UserError
from cic.llm.engines.probe import EngineProbe
from cic.pipeline.config import PipelineConfig, load_config


def model_problem(spec: str) -> str | None:
    """Why a model spec names nothing loadable (None when it resolves: a file, a package file or a hub id)."""
    from cic.llm.models import resolve_source

    try:
        resolve_source(spec)
    except (FileNotFoundError, ValueError) as exc:
        return str(exc)
    return None


def kept_layer_problem(layers: tuple[int, ...], spec: str) -> str | None:
    """Why `generation.keep_hidden` names a layer this local model lacks, read from its files' metadata (None when
    it fits, or for a hub id: its worker checks once it has the files) — a config error, not a failed model."""
    from cic.llm.hidden import check_layers
    from cic.llm.models import block_count

    try:
        check_layers(layers, block_count(spec))
    except UserError as exc:
        return str(exc)
    return None


def dataset_problem(name: str, source: str) -> str | None:
    """Why a dataset entry cannot be read: unknown name, or a local source that does not exist."""
    from cic.data import DATASETS

    if name not in DATASETS.names():
        return f"dataset {name!r} is not registered; choose from {', '.join(DATASETS.names())}"
    if source in ("bundled", "sample", "hub") or (HUB_ID.match(source) and not Path(source).exists()
                                                    and not source.endswith((".jsonl", ".json", ".parquet", ".pq"))):
        return None
    if not Path(source).expanduser().exists():
        return f"source = {source!r}: no such file or directory"
    return None


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, within `timeout_s`, a Ray address where nothing listens (ray.init would retry for minutes)."""
    import socket

    if address in ("auto", "local"):
        return
    host_port = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"ray address = {address!r}: expected HOST:PORT or ray://HOST:PORT (or 'auto')")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"ray address = {address!r}: nothing answers at {host}:{port} within {timeout_s:g} s "
                         f"({exc.strerror or exc}); start the cluster or fix --ray-address") from None


def check_store(db: str | Path, *, must_exist: bool = False, option: str = "storage.db") -> None:
    """Refuse, before any service starts, a store path whose directory is missing, or a file that is not a
    readable DuckDB store (damaged, or another kind of file); a store another process holds, or one in an
    older layout (migrated on the first write), passes."""
    from cic.store import Store
    from cic.store.database import DamagedStoreError, NotADuckDBFileError, StoreError

    path = Path(db).expanduser()
    if not path.parent.is_dir():
        raise UserError(f"{option} = {str(db)!r}: directory {str(path.parent)!r} does not exist; create it or "
                         "point --db elsewhere")
    if not path.exists():
        if must_exist:
            raise UserError(f"{option} = {str(db)!r}: no such file (nothing stored yet; run `cic run` first)")
        return
    try:
        Store.open(path, read_only=True).close()
    except (DamagedStoreError, NotADuckDBFileError):
        raise
    except StoreError:
        return  # locked by a writer (writes wait their turn) or an older layout (migrated when written)


def probe_models(config: PipelineConfig, *, known: dict[str, EngineProbe] | None = None) -> dict[str, EngineProbe]:
    """Every model's engine probed once (`cic.llm.engines`; a served model answers one token, every replica
    asked) unless `known` holds it already: what keys its runs, passed down to its workers. A URL where nothing
    listens, an unset key variable or replicas serving different models are a UserError naming the model."""
    from cic.llm.engines import engine_class

    probes = dict(known or {})
    for index, model in enumerate(config.models):
        if model.name in probes:
            continue
        try:
            probes[model.name] = engine_class(model.kind).probe(config.answerer_settings(index))
        except UserError as exc:
            raise UserError(f"model {model.name!r}: {exc}") from None
    return probes


def probe_lines(config: PipelineConfig, probes: dict[str, EngineProbe]) -> list[str]:
    """One line per probed model that has something to say (a served model: its engine, what its log-probabilities
    are, whether it honours `n`, its identity-check answer): printed once per run, on the console and in the
    flow's log."""
    from cic.llm.engines import engine_class

    lines = []
    for model in config.models:
        if model.name in probes and (said := engine_class(model.kind).describe(probes[model.name])):
            lines.append(f"model {model.name!r}: {said}")
    return lines


def preflight(config_path: str | Path, *, ray_address: str | None = None, db: str | None = None) -> PipelineConfig:
    """The validated config; a UserError naming the file, the key path and the value otherwise. A Ray
    address (given, the config's, or $RAY_ADDRESS) must answer within seconds; the store (`db` or the
    config's) must be creatable or readable."""
    config = load_config(config_path)
    check_store(db or config.storage.db, option="--db" if db else "storage.db")
    address = config.ray.address_to_join(ray_address)
    if address:
        check_ray_address(address)
    problems = []
    for i, model in enumerate(config.models):
        if model.spec is not None and (why := model_problem(model.spec)) is not None:
            problems.append(f"models.{i}.spec: {why}")
        elif model.spec is not None and config.generation.keep_hidden and \
                (why := kept_layer_problem(config.generation.keep_hidden, model.spec)) is not None:
            problems.append(f"models.{i} ({model.name}): {why}")
    for i, dataset in enumerate(config.datasets):
        if (why := dataset_problem(dataset.name, dataset.source)) is not None:
            problems.append(f"datasets.{i}: {why}")
    if config.uncertainty.embedding_model and (why := model_problem(config.uncertainty.embedding_model)) is not None:
        problems.append(f"uncertainty.embedding_model: {why}")
    if problems:
        raise UserError(f"config = {str(config_path)!r}: " + "; ".join(problems))
    return config
