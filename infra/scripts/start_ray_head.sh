#!/usr/bin/env bash
# Start a Ray head node on this machine (workers join with: ray start --address=<head-ip>:6379).
# Point CIC at it with: export RAY_ADDRESS=<head-ip>:6379   (or cic run --ray-address ...)
set -euo pipefail
PORT=${CIC_RAY_PORT:-6379}
exec "$(dirname "$0")/../../.venv/bin/ray" start --head --port "$PORT" --include-dashboard=false --block
