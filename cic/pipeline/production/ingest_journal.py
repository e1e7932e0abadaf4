"""A large ingest's journal: its commit plan, its checked data staged beside the store, one commit per step, and
completing (`cic ingest --complete`) or abandoning (`--abandon`) an ingest that was cut off; the refusal every
reader of an unfinished store gets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.production.ingest_changes import Changes, Stage, checked_labels, checked_records, record_changes
from cic.pipeline.production.ingest_options import SPLIT, IngestStats
from cic.pipeline.run import progress
from cic.store.ingest_queries import (
    unfinished_ingest_files,
    write_staged,
)

if TYPE_CHECKING:
    from cic.store import Store



def commit_plan(steps: list[tuple[str, list[str]]]) -> str:
    """The commit steps as JSON: each step's kind and the rows of each staged file (Parquet metadata only)."""
    import json

    import pyarrow.parquet as pq

    return json.dumps([[kind, [pq.read_metadata(f).num_rows for f in files]] for kind, files in steps])


def write_step(store: Store, kind: str, files: list[str], path: Path, now: datetime, digest: str) -> None:
    """Upsert one kind of staged file into its tables, as written by the ingest `digest`."""
    write_staged(store, kind, files, path.name, now, SPLIT, digest)


MANIFEST = "manifest.json"


def staging_dir(store: Store, digest: str) -> Path:
    """Where a journaled ingest keeps its checked, staged data until its last commit (beside the store, named by
    the store and the file's sha256): what `complete_ingest` completes from and `abandon_ingest` removes."""
    return store.path.parent / f".cic-ingest-{store.path.name}-{digest[:16]}"


def persist_staged(store: Store, digest: str, path: Path, now: datetime, steps: list[tuple[str, list[str]]],
             stats: IngestStats, *, committed: int = 0) -> list[tuple[str, list[str]]]:
    """Move the steps' staged files into the ingest's staging directory and write its manifest (last, so a
    manifest means the staged data is complete); returns the steps with their new paths."""
    import os
    import shutil

    target = staging_dir(store, digest)
    shutil.rmtree(target, ignore_errors=True)  # a superseded attempt's
    target.mkdir()
    moved = []
    for kind, files in steps:
        names = []
        for file in files:
            name = f"{kind}-{Path(file).name}"
            os.replace(file, target / name)
            names.append(name)
        moved.append((kind, names))
    _write_manifest(target, {"digest": digest, "file": str(path.resolve()), "source": path.name,
                             "stamp": now.isoformat(), "records": stats.records, "labels": stats.labels,
                             "steps": moved, "committed": committed})
    return [(kind, [str(target / n) for n in names]) for kind, names in moved]


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    import json
    import os

    partial = directory / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest))
    os.replace(partial, directory / MANIFEST)


def staged_manifest(store: Store, digest: str) -> dict[str, Any] | None:
    """The manifest of an ingest's staged data when it is complete (the manifest and every file it names), else
    None."""
    import json

    directory = staging_dir(store, digest)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("digest") != digest:
        return None
    if not all((directory / name).is_file() for _, names in manifest["steps"] for name in names):
        return None
    return manifest


def commit_steps(store: Store, digest: str, steps: list[tuple[str, list[str]]], first: int, source: str,
                  stamp: datetime, file: Path | None = None, before: Callable[[], None] | None = None) -> None:
    """Commit the steps from `first` on, one transaction each (the manifest counts them after each commit, so a
    completion redoes at most one: upserts are idempotent), then mark the journal done and drop the staged data.
    `before` runs in the first step's transaction, ahead of its writes (a completion's change events)."""
    import shutil

    directory = staging_dir(store, digest)
    manifest = staged_manifest(store, digest)
    journal = store.read("ingests", digest=digest).row(0, named=True)
    for index in range(first, len(steps)):
        kind, files = steps[index]
        with store.transaction():
            if before is not None and index == first:
                before()
            write_step(store, kind, files, Path(source), stamp, digest)
            store.upsert("ingests", pl.DataFrame([{**journal, "committed": index + 1}], schema=schema.INGESTS.schema))
        if manifest is not None:
            _write_manifest(directory, {**manifest, "committed": index + 1})
        progress.report(f"ingest {digest[:12]} commits", index + 1, len(steps))
    with store.transaction():
        row = store.read("ingests", digest=digest).row(0, named=True)
        store.upsert("ingests", pl.DataFrame([{**row, "state": "done", "finished_at": datetime.now(UTC),
                                               **({"file": str(file.resolve())} if file else {})}],
                                             schema=schema.INGESTS.schema))
    shutil.rmtree(directory, ignore_errors=True)


def journal_entry(store: Store, digest: str) -> dict[str, Any] | None:
    rows = store.read("ingests", digest=digest)
    return rows.row(0, named=True) if rows.height else None


def find_ingest(store: Store, ingest_id: str, option: str) -> dict[str, Any]:
    """The unfinished journal entry that `ingest_id` names: its sha256 (or a prefix of at least 6 characters, as
    the recalibration refusal shows) or its file's path."""
    text = ingest_id.strip()
    rows = store.read("ingests")
    by_file = rows.filter(pl.col("file") == str(Path(text).expanduser().resolve())) if text else rows.clear()
    found = by_file if by_file.height else (rows.filter(pl.col("digest").str.starts_with(text.lower()))
                                            if len(text) >= 6 else rows.clear())
    unfinished = ", ".join(f"{r['digest'][:12]} ({r['file']})" for r in rows.filter(state="writing")
                           .iter_rows(named=True)) or "none"
    if found.height != 1:
        why = "matches several; give more characters" if found.height else "names no ingest journal entry"
        raise UserError(f"{option} = {ingest_id!r}: {why} (unfinished ingests in {store.path}: {unfinished})")
    row = found.row(0, named=True)
    if row["state"] != "writing":
        raise UserError(f"{option} = {ingest_id!r}: the ingest of {row['file']!r} is {row['state']}, not "
                         f"unfinished; nothing to do (unfinished ingests: {unfinished})")
    return row


def complete_ingest(store: Store, ingest_id: str, *, file: Path | None = None, relabel: bool = False,
                    replace: bool = False) -> IngestStats:
    """Finish a cut-off ingest from its staged data (checked before its first commit), without its file: the
    steps not yet committed, then the journal marked done. Refused, saying what to do, when that data is gone —
    and when a later ingest stored other labels or records than the steps left would write, unless `relabel` /
    `replace` let this file's values win (then recorded and flagged like any change)."""
    journal = find_ingest(store, ingest_id, "--complete")
    digest = journal["digest"]
    manifest = staged_manifest(store, digest)
    if manifest is None:
        raise UserError(f"--complete = {ingest_id!r}: the staged data of the ingest of {journal['file']!r} is gone "
                         f"or incomplete ({staging_dir(store, digest)}); rerun `cic ingest FILE` with that file's "
                         f"bytes (any name) to complete it, or `cic ingest --abandon {digest[:12]}` to undo what it "
                         "stored")
    directory = staging_dir(store, digest)
    steps = [(kind, [str(directory / n) for n in names]) for kind, names in manifest["steps"]]
    stats = IngestStats(file=str(file or journal["file"]), records=int(manifest["records"]),
                        labels=int(manifest["labels"]))
    first = max(int(manifest["committed"]), int(journal["committed"] or 0))
    source, stamp = manifest["source"], datetime.fromisoformat(manifest["stamp"])
    left = {kind: [f for k, files in steps[first:] if k == kind for f in files] for kind in ("records", "scores",
                                                                                            "labels")}
    later = (digest, journal["started_at"])
    changes = Changes(checked_labels(store, left["labels"], f"file {source!r}", relabel, later),
                      checked_records(store, left["records"], left["scores"], f"file {source!r}", replace, later))
    with store.scratch("ingest") as tmp:
        commit_steps(store, digest, steps, first, source, stamp, file, before=(
            (lambda: record_changes(store, Stage(Path(tmp)), changes, source, stamp, stats)) if changes else None))
    return stats


def abandon_ingest(store: Store, ingest_id: str) -> dict[str, int]:
    """Undo a cut-off ingest in one transaction: every row it stored first that no other ingest (done or
    unfinished) wrote since (records, questions, answers, scores, labels, the runs it registered that hold
    nothing else), labels it relabelled and record fields it replaced (answer, question, gold, time, scores) that
    nothing rewrote since back to their old value, its label and record events and the gate flags they raised; the
    journal entry is marked abandoned and its staged data removed. Returns rows removed per table."""
    import shutil

    from cic.store.abandon import delete_ingest_rows

    journal = find_ingest(store, ingest_id, "--abandon")
    digest = journal["digest"]
    manifest = staged_manifest(store, digest)
    directory = staging_dir(store, digest)
    staged = None if manifest is None else {kind: [str(directory / n) for k, names in manifest["steps"] if k == kind
                                                   for n in names] for kind in ("records", "labels")}
    with store.transaction():
        done = delete_ingest_rows(store, stamp=journal["started_at"], digest=digest,
                                  records=staged and staged["records"], labels=staged and staged["labels"],
                                  step=lambda n, total: progress.report(f"abandon {digest[:12]}", n, total))
        store.upsert("ingests", pl.DataFrame([{**journal, "state": "abandoned", "finished_at": datetime.now(UTC)}],
                                             schema=schema.INGESTS.schema))
    shutil.rmtree(directory, ignore_errors=True)
    return done


def refusal(store: Store) -> str | None:
    """Why recalibration must wait (an ingest cut off between commits) and both ways out, or None."""
    cut = store.read("ingests", state="writing").sort("started_at")
    if cut.height == 0:
        return None
    row = cut.row(0, named=True)
    short, db = row["digest"][:12], store.path
    staged = staged_manifest(store, row["digest"]) is not None
    complete = (f"complete it — `cic ingest --complete {short} --db {db}` (from its staged data, no file needed) or "
                f"rerun `cic ingest {row['file']} --db {db}`" if staged else
                f"complete it — its staged data is gone, so rerun `cic ingest {row['file']} --db {db}` (the same "
                "bytes, any name)")
    return (f"the ingest of {row['file']!r} (id {short}) was cut off before its last commit ({cut.height} unfinished "
            f"in {db}); {complete} — or undo what it stored with `cic ingest --abandon {short} --db {db}`; then "
            "recalibrate")


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks: what the ingest journal knows a file by."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def path_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (each one's path below it and digest, in order): what a
    table logged from a harness's run folder is known by."""
    import hashlib

    if not path.is_dir():
        return file_digest(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{file_digest(file)}\n".encode())
    return digest.hexdigest()


def unfinished_ingests(store: Store) -> list[str]:
    """Files whose ingest was cut off between commits (a kill, a full disk): rerunning it completes it."""
    return unfinished_ingest_files(store)
