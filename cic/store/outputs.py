"""Output files that never clobber inputs: every command that writes a file checks the path first and writes
through a temporary file renamed into place, so a store, an input or a foreign database is never replaced and a
full disk leaves the old file (or nothing), never half a file.

    target = guard_output(out, "--out", inputs=[db, table_file], force=force)
    with atomic_output(target, "--out") as partial:
        partial.write_text(text)
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

#: Parquet key-value metadata that marks a file this project wrote (so rewriting it needs no --force)
WRITTEN_BY_KEY = b"cic.written_by"
WRITTEN_BY = b"cic"
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class OutputError(ValueError):
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


def guard_output(path: str | Path, option: str, *, inputs: Iterable[str | Path | None] = (),
                 force: bool = False) -> Path:
    """The output path, checked before any work: its directory exists, it is not a directory, not one of the
    command's `inputs` (a store counts with its `.wal`), and not a database or Parquet file cic did not write
    (unless `force`)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputError(f"{option} = {str(target)!r} is a directory; give a file name")
    if not target.parent.is_dir():
        raise OutputError(f"{option} = {str(target)!r}: directory {str(target.parent)!r} does not exist")
    for given in inputs:
        if given is None:
            continue
        source = Path(given).expanduser()
        for candidate in (source, source.with_name(source.name + ".wal")):
            if _same_file(target, candidate):
                raise OutputError(f"{option} = {str(target)!r} is also an input of this command ({str(candidate)!r});"
                                  " writing it would destroy that input — give another file name")
    kind = _kind(target) if target.exists() else None
    if kind is not None and not force:
        raise OutputError(f"{option} = {str(target)!r} already holds {kind} that cic did not write; refusing to "
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


def write_frame(frame: object, target: str | Path, option: str) -> None:
    """Write a polars frame as CSV or Parquet (by suffix) atomically; Parquet carries cic's marker so a rerun may
    replace it without --force."""
    import pyarrow.parquet as pq

    suffix = Path(target).suffix.lower()
    with atomic_output(target, option) as partial:
        if suffix == ".csv":
            frame.write_csv(partial)  # type: ignore[attr-defined]
        else:
            arrow = frame.to_arrow()  # type: ignore[attr-defined]
            pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}),
                                                          WRITTEN_BY_KEY: WRITTEN_BY}), partial)


def guard_output_dir(path: str | Path, option: str) -> Path:
    """A directory a command writes several files into: refused when the path is an existing file (a store, an
    input) — writing there would fail half-way or replace it."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise OutputError(f"{option} = {str(target)!r} is an existing file, not a directory; give a directory to "
                          "write into (it is created if missing)")
    return target
