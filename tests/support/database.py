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
