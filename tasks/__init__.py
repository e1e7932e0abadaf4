"""Prefect tasks: thin wrappers that call cic and move data."""
