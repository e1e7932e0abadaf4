#!/usr/bin/env bash
# Start a Prefect worker that executes scheduled CIC flow runs from the "cic-process" work pool.
# Needs PREFECT_API_URL (a running Prefect server) and, for remote services, MLFLOW_TRACKING_URI / RAY_ADDRESS.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CIC_HOME=${CIC_HOME:-$PWD}   # where deployments run (infra/prefect.yaml pull step)
POOL=${CIC_WORK_POOL:-cic-process}
.venv/bin/prefect work-pool create "$POOL" --type process 2>/dev/null || true
exec .venv/bin/prefect worker start --pool "$POOL"
