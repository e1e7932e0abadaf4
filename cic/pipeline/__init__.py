"""Service-free pieces of the batch pipeline: the typed config (with the configs shipped in `configs/`),
calibration of stored results, scheduled recalibration, serving one question, and progress events.

Prefect tasks and flows (`tasks/`, `flows/`) call these; nothing here imports Prefect, Ray or MLflow.
"""
