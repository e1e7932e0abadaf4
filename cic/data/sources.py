"""Read raw records from one source: the bundled sample, a local JSONL/Parquet file or directory of Parquet
shards (the hub's column layout), or the Hugging Face hub through `datasets.load_dataset` (lazily imported).

Every record keeps where it came from (file and line or row), so a bad record is reported by location.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from cic.data.registry import DatasetSpec
from cic.errors import UserError

SAMPLE = "sample"
HUB = "hub"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".pq")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name


class DatasetSourceError(UserError):
    """A source cannot be read: missing file, empty data, unreachable hub, bad JSON."""


@dataclass
class Records:
    """Raw records in source order with the location of each (for error messages)."""

    origin: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)

    def add(self, row: Any, location: str) -> None:
        if not isinstance(row, dict):
            raise DatasetSourceError(f"{location}: expected a JSON object (one record), got {type(row).__name__}")
        self.rows.append(row)
        self.locations.append(location)


def sample_path(filename: str) -> Path:
    """The path of a bundled sample file inside the installed package."""
    path = Path(str(resources.files("cic.data") / "samples" / filename))
    if not path.is_file():
        raise DatasetSourceError(f"bundled sample {filename!r} is missing from the installed package ({path}); "
                                 "reinstall cic")
    return path


def read_records(spec: DatasetSpec, source: str | Path | None, split: str) -> Records:
    """Records of `spec` from `source`: None (the dataset's default), "sample", "hub", a hub id or a path."""
    if source is None:
        source = spec.default_source or (SAMPLE if spec.sample else None)
        if source is None:
            raise DatasetSourceError(f"dataset {spec.name!r} has no bundled sample or default path; give a source "
                                     "(a JSONL/Parquet file or directory, or a hub id)")
    if source == SAMPLE:
        if spec.sample is None:
            raise DatasetSourceError(f"dataset {spec.name!r} has no bundled sample; give a file or hub id as source")
        if split != "validation":
            raise DatasetSourceError(f"split = {split!r}: the bundled {spec.name} sample holds validation rows only")
        return read_path(sample_path(spec.sample))
    if source == HUB:
        if spec.hub_id is None:
            raise DatasetSourceError(f"dataset {spec.name!r} has no hub id; give a hub id or a local path as source")
        return read_hub(spec.hub_id, spec.hub_config, split)
    path = Path(source).expanduser()
    if path.exists():
        return read_path(path, split=split, config=spec.hub_config)
    text = str(source)
    if path.suffix.lower() in FILE_SUFFIXES or not HUB_ID.match(text):
        raise DatasetSourceError(f"source = {text!r}: no such file or directory")
    return read_hub(text, spec.hub_config if text == spec.hub_id else None, split,
                    hint=f" (there is no local file or directory {text!r} either)")


def read_path(path: Path, *, split: str | None = None, config: str | None = None) -> Records:
    """A JSONL/JSON/Parquet file, or a directory of them (the split's shards when names say `<split>-*`)."""
    if path.is_dir():
        return _read_directory(path, split, config)
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise DatasetSourceError(f"source = {str(path)!r}: unsupported file type {suffix or '(none)'!r}; use "
                                 f"{', '.join(FILE_SUFFIXES)} or a directory of Parquet shards")
    records = Records(repr(str(path)))
    _read_file(path, records)
    if not records.rows:
        raise DatasetSourceError(f"source = {str(path)!r}: the file holds no records")
    return records


def _read_file(path: Path, records: Records) -> None:
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise DatasetSourceError(f"{str(path)!r} cannot be read as Parquet: {exc}") from None
        for i, row in enumerate(rows):
            records.add(row, f"row {i} of {path.name!r}")
        return
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):  # a JSON array of records
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetSourceError(f"{str(path)!r} is not valid JSON: {exc}") from None
        for i, row in enumerate(rows):
            records.add(row, f"record {i} of {path.name!r}")
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetSourceError(f"line {number} of {str(path)!r} is not valid JSON: {exc.msg}") from None
        records.add(row, f"line {number} of {path.name!r}")


def _read_directory(path: Path, split: str | None, config: str | None) -> Records:
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if config is not None and any(config in p.relative_to(path).parts for p in files):
        files = [p for p in files if config in p.relative_to(path).parts]
    if split is not None:
        of_split = [p for p in files if p.name.startswith(f"{split}-") or p.name.startswith(f"{split}.")
                    or split in p.relative_to(path).parts[:-1]]
        files = of_split or files
    if not files:
        raise DatasetSourceError(f"source = {str(path)!r}: the directory holds no {', '.join(FILE_SUFFIXES)} files")
    records = Records(f"{str(path)!r} ({len(files)} file(s))")
    for file in files:
        _read_file(file, records)
    if not records.rows:
        raise DatasetSourceError(f"source = {str(path)!r}: the files hold no records")
    return records


def read_hub(hub_id: str, config: str | None, split: str, hint: str = "") -> Records:
    """Records from the Hugging Face hub (needs internet or a warm local cache)."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DatasetSourceError(f"loading {hub_id!r} from the hub needs the 'datasets' package: {exc}") from None
    where = f"hub dataset {hub_id!r}" + (f" config {config!r}" if config else "") + f" split {split!r}"
    try:
        data = datasets.load_dataset(hub_id, config, split=split)
    except Exception as exc:  # network, auth, unknown dataset or split: all mean "cannot load from the hub"
        raise DatasetSourceError(
            f"cannot load {where}{hint}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
            "Without internet, use the bundled sample (source 'sample') or a local JSONL/Parquet copy in the "
            "hub's column layout (a file or a directory of Parquet shards).") from None
    records = Records(where)
    for i, row in enumerate(data.to_list()):
        records.add(row, f"row {i} of {where}")
    if not records.rows:
        raise DatasetSourceError(f"{where} holds no records")
    return records
