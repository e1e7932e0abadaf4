"""Persistence: the DuckDB store (the pipeline's single source of truth) and every SQL statement run on it
(`queries`, `ingest_queries`), resume planning over it, safe output files, and the reader of (score, error)
files that the statistics commands take.

    from cic.store import Store
    with Store.open("cic.duckdb", read_only=True) as store: ...
"""

from cic.store.database import NotADuckDBFileError, Store, StoreError, StoreLockedError

__all__ = ["NotADuckDBFileError", "Store", "StoreError", "StoreLockedError"]
