#!/usr/bin/env bash
# Start an MLflow tracking server on this machine, without Docker: SQLite backend, artifacts on local disk.
# Point CIC at it with: export MLFLOW_TRACKING_URI=http://$HOST:$PORT
set -euo pipefail
HOST=${CIC_MLFLOW_HOST:-127.0.0.1}
PORT=${CIC_MLFLOW_PORT:-5000}
DATA=${CIC_MLFLOW_DATA:-$HOME/.cic/mlflow}
mkdir -p "$DATA/artifacts"
# MLflow's job runner (huey consumers for its GenAI jobs) stays off: CIC submits no such job, and its consumers
# cost more CPU than the tracking server itself. Set MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true to keep it.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
exec "$(dirname "$0")/../../.venv/bin/mlflow" server \
  --backend-store-uri "sqlite:///$DATA/mlflow.db" \
  --artifacts-destination "$DATA/artifacts" \
  --host "$HOST" --port "$PORT"
