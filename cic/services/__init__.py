"""Adapters to running services: Ray pools and the answer worker, MLflow tracking, registry and artifact
locations, Prefect run names, loggers and concurrency limits, and the processes a command owns (stopped with it,
even after a kill). The Prefect tasks and flows (`tasks/`, `flows/`) and the CLI call these."""
