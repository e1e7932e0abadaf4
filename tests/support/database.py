"""Raw edits of database files, behind the store's back (to build older, damaged or tampered files)."""

from __future__ import annotations

from pathlib import Path

import duckdb


def raw_sql(path: Path, *statements: str, params: list | None = None) -> None:
    """Change a database file behind the store's back (to build older or damaged files)."""
    con = duckdb.connect(str(path))
    try:
        for statement in statements:
            con.execute(statement, params)
    finally:
        con.close()


def copy_store(folder: Path, into: Path) -> None:
    """Copy a store built once per module (its DuckDB file and whatever sits beside it) into a test's own folder,
    so each test moves gates on its own copy."""
    import shutil

    for item in folder.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, into / item.name)
