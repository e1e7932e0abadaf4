"""Output files that never clobber inputs: every command that writes a file checks the path first and writes
through a temporary file renamed into place, so a store, an input, a file cic did not write or a device is never
replaced, and a full disk leaves the old file (or nothing), never half a file.

    target = guard_output(out, "--out", inputs=[db, table_file], force=force)
    with atomic_output(target, "--out") as partial:
        partial.write_text(text)

A symbolic link is written through: the file it names is replaced (atomically, beside itself) and the link
stays, so a serving system that reads the link's target sees the new file. Devices, named pipes and sockets are
refused. An existing file is replaced without --force only when cic wrote it: a Parquet file with cic's marker, a
JSON document of cic's (`"kind": "cic.…"`, or the gate export's entries), a CSV with the columns being written.
A directory cic writes several files into carries a marker file (`.cic-output`); a directory that holds other
files, or one that holds an input of the command, is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from cic.errors import UserError

#: Parquet key-value metadata that marks a file this project wrote (so rewriting it needs no --force)
WRITTEN_BY_KEY = b"cic.written_by"
WRITTEN_BY = b"cic"
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: the file that marks a directory cic writes into (reports, validity studies, the pipeline's report_dir)
DIRECTORY_MARKER = ".cic-output"
_LARGEST_JSON_READ = 256 * 1024 * 1024  # a larger "JSON output" is not one of cic's documents


class OutputError(UserError):
    """An output path refused, or a write that failed; the message names the option and the path."""


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _kind(path: Path) -> str | None:
    """'a DuckDB database', 'a SQLite database' or 'a Parquet file' not written by cic; None otherwise."""
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError:
        return None
    if head[8:12] == b"DUCK":
        return "a DuckDB database"
    if head.startswith(b"SQLite format 3"):
        return "a SQLite database"
    if head.startswith(b"PAR1"):
        try:
            import pyarrow.parquet as pq

            metadata = pq.read_metadata(path).metadata or {}
        except Exception:  # an unreadable Parquet file is still not ours to replace
            return "a Parquet file"
        return None if any(k.startswith(b"cic.") for k in metadata) else "a Parquet file"
    return None


def _special(path: Path) -> str | None:
    """'a character device', 'a named pipe', ... for a path (a link followed) that is no regular file or
    directory; None otherwise. Writing to one would replace the node or block forever."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def _is_cic_json(path: Path) -> bool:
    """A JSON document cic writes: an object of kind 'cic.*', or the gate export's list of entries."""
    try:
        if path.stat().st_size > _LARGEST_JSON_READ:
            return False
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if isinstance(document, dict):
        return str(document.get("kind", "")).startswith("cic.")
    return isinstance(document, list) and all(isinstance(e, dict) and "serve" in e for e in document)


def _foreign(path: Path, writes: str) -> str | None:
    """What an existing output file holds when cic did not write it ('a DuckDB database', 'a file'); None if it is
    cic's own (replaceable) or a CSV whose columns `write_frame` checks when it writes."""
    kind = _kind(path)
    if kind is not None:
        return kind
    if writes == "json":
        return None if _is_cic_json(path) else "a file"
    if writes == "frame":
        if path.suffix.lower() == ".csv":
            return None  # its header is compared with the table being written (write_frame)
        with contextlib.suppress(OSError), path.open("rb") as handle:
            if handle.read(4) == b"PAR1":
                return None  # cic's Parquet (a foreign one was named by _kind)
        return "a file"
    return None


def guard_output(path: str | Path, option: str, *, inputs: Iterable[str | Path | None] = (),
                 force: bool = False, writes: str = "any",
                 others: Mapping[str, str | Path | None] | None = None) -> Path:
    """The output path, checked before any work: its directory exists; it is no directory, device, pipe or
    socket; not one of the command's `inputs` (a store counts with its `.wal`, a folder with every file under it)
    nor another output of the same command (`others`: option -> path); and, unless `force`, not a file cic did not
    write (`writes`: "json" or "frame" says what cic would have written there). A symbolic link is resolved: its
    target is the output."""
    given = Path(path).expanduser()
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    special = _special(target)
    if special is not None:
        raise OutputError(f"{option} = {str(given)!r} is {special}, not a file; give a file name")
    if target.is_dir():
        raise OutputError(f"{option} = {str(given)!r} is a directory; give a file name")
    if not target.parent.is_dir():
        raise OutputError(f"{option} = {str(given)!r}: directory {str(target.parent)!r} does not exist")
    for other, other_path in (others or {}).items():
        if other_path is not None and _same_file(target, Path(other_path).expanduser()):
            raise OutputError(f"{option} = {str(given)!r} is the same file as {other}; give each output its own "
                              "file name")
    for given_input in inputs:
        if given_input is None:
            continue
        source = Path(given_input).expanduser()
        if source.is_dir() and Path(os.path.realpath(target)).is_relative_to(os.path.realpath(source)):
            raise OutputError(f"{option} = {str(given)!r} is inside {str(source)!r}, a folder this command reads; "
                              "writing there would change (or destroy) its input — give a file name outside it")
        for candidate in (source, source.with_name(source.name + ".wal")):
            if _same_file(target, candidate):
                raise OutputError(f"{option} = {str(given)!r} is also an input of this command ({str(candidate)!r});"
                                  " writing it would destroy that input — give another file name")
    kind = _foreign(target, writes) if target.is_file() else None
    if kind is not None and not force:
        raise OutputError(f"{option} = {str(given)!r} already holds {kind} that cic did not write; refusing to "
                          "replace it (give another file name, or --force if you mean it)")
    return target


@contextlib.contextmanager
def atomic_output(target: str | Path, option: str) -> Iterator[Path]:
    """A temporary path beside `target`, renamed onto it when the block succeeds and removed when it fails; a
    write error (a full disk, a quota) becomes one OutputError saying that nothing was replaced."""
    final = Path(target).expanduser()
    partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        why = "the disk is full (or the file too large for its quota)" if exc.errno in _DISK_FULL else \
            exc.strerror or str(exc)
        previous = "the previous file is unchanged" if final.exists() else "no file was written"
        raise OutputError(f"{option} = {str(final)!r}: cannot be written: {why}; {previous}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def write_text(target: str | Path, text: str, option: str) -> None:
    """Write `text` to `target` atomically (see `atomic_output`)."""
    with atomic_output(target, option) as partial:
        partial.write_text(text, encoding="utf-8")


def csv_header(path: Path) -> list[str] | None:
    """The column names of a CSV file's first line (None when it cannot be read as text)."""
    import csv

    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def write_frame(frame: object, target: str | Path, option: str, *, force: bool = False) -> None:
    """Write a polars frame as CSV or Parquet (by suffix) atomically; Parquet carries cic's marker so a rerun may
    replace it without --force; an existing CSV with other columns is not cic's table and needs `force`."""
    import pyarrow.parquet as pq

    final = Path(target).expanduser()
    suffix = final.suffix.lower()
    if suffix == ".csv" and final.is_file() and not force:
        header = csv_header(final)
        columns = list(frame.columns)  # type: ignore[attr-defined]
        if header != columns:
            shown = "unreadable text" if header is None else f"columns {', '.join(header[:6])}" + \
                ("…" if len(header) > 6 else "")
            raise OutputError(f"{option} = {str(final)!r} already holds a CSV file cic did not write ({shown}); "
                              "refusing to replace it (give another file name, or --force if you mean it)")
    with atomic_output(final, option) as partial:
        if suffix == ".csv":
            frame.write_csv(partial)  # type: ignore[attr-defined]
        else:
            arrow = frame.to_arrow()  # type: ignore[attr-defined]
            pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}),
                                                          WRITTEN_BY_KEY: WRITTEN_BY}), partial)


def guard_output_dir(path: str | Path, option: str, *, inputs: Iterable[str | Path | None] = (),
                     force: bool = False) -> Path:
    """A directory a command writes several files into, checked and claimed before any work: refused when the
    path is an existing file or special file, when an input of the command lies inside it (a report written over
    its own table), or, unless `force`, when it already holds files and no `.cic-output` marker (not cic's to
    overwrite). Then it is created if missing and marked."""
    given = Path(path).expanduser()
    target = Path(os.path.realpath(given))
    special = _special(target)
    if special is not None:
        raise OutputError(f"{option} = {str(given)!r} is {special}, not a directory")
    if target.exists() and not target.is_dir():
        raise OutputError(f"{option} = {str(given)!r} is an existing file, not a directory; give a directory to "
                          "write into (it is created if missing)")
    for given_input in inputs:
        if given_input is None:
            continue
        source = Path(os.path.realpath(Path(given_input).expanduser()))
        if source == target or target in source.parents:
            raise OutputError(f"{option} = {str(given)!r} holds an input of this command ({str(given_input)!r}); "
                              "writing there could replace it — give another directory")
    if target.is_dir() and not force and not (target / DIRECTORY_MARKER).exists():
        held = sorted(p.name for p in target.iterdir())
        if held:
            raise OutputError(f"{option} = {str(given)!r} already holds files cic did not write ("
                              f"{', '.join(held[:3])}{', …' if len(held) > 3 else ''}); give a new or empty "
                              "directory, or --force if cic may replace what it writes there")
    try:
        target.mkdir(parents=True, exist_ok=True)
        marker = target / DIRECTORY_MARKER
        if not marker.exists():
            marker.write_text("This directory is written by cic (reports, tables, figures); cic replaces its own "
                              "files here.\n", encoding="utf-8")
    except OSError as exc:  # a file where a parent should be, no permission, a full or read-only disk
        raise OutputError(f"{option} = {str(given)!r}: the directory cannot be made ({exc.strerror or exc}"
                          + (f": {exc.filename}" if exc.filename else "") + ")") from None
    return given
