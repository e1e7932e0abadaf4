"""Persistence: the DuckDB store (the pipeline's single source of truth), resume planning over it, and the
reader of (score, error) files that the statistics commands take.

    from cic.store import Store
    with Store.open("cic.duckdb", read_only=True) as store: ...
"""

from cic.store.database import NotADuckDBFileError, Store, StoreError, StoreLockedError

__all__ = ["NotADuckDBFileError", "Store", "StoreError", "StoreLockedError"]
