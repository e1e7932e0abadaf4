"""Prefect tasks only: they carry retries, timeouts and run names around work that lives in `cic` (`log` wraps
`cic.services.mlflow_results.log_store`, `calibrate` wraps `cic.pipeline.gates.calibrate_store`); `answer` and
`recalibrate` still hold their stage's loop. Adapters to Ray, MLflow and Prefect live in `cic.services`."""
