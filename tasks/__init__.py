"""Prefect tasks only: thin wrappers that call cic, move data between the store and the services, and carry
retries, timeouts and run names (adapters to Ray, MLflow and Prefect live in `cic.services`)."""
