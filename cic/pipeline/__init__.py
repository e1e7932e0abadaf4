"""Pipeline logic without services: the typed config (with the configs shipped in `configs/`), calibration of
stored results, scheduled recalibration and its monitors, ingest of production records, the gate lifecycle,
serving one question, preflight checks and progress events.

Prefect tasks and flows (`tasks/`, `flows/`) and the CLI call these; nothing here imports Prefect, Ray or MLflow
or starts a process (that is `cic.services`).
"""
