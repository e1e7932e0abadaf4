#!/usr/bin/env bash
# Start a Prefect API server (with UI) on this machine, without Docker.
# State lives in $PREFECT_HOME (default ~/.prefect, SQLite); set PREFECT_API_DATABASE_CONNECTION_URL for PostgreSQL.
set -euo pipefail
HOST=${CIC_PREFECT_HOST:-127.0.0.1}
PORT=${CIC_PREFECT_PORT:-4200}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
export DO_NOT_TRACK=${DO_NOT_TRACK:-true}
# the UI calls the API at this address (its default is port 4200 whatever port the server listens on)
export PREFECT_UI_API_URL=${PREFECT_UI_API_URL:-http://$HOST:$PORT/api}
echo "Prefect API will be at http://$HOST:$PORT/api (export PREFECT_API_URL=http://$HOST:$PORT/api)"
exec "$(dirname "$0")/../../.venv/bin/prefect" server start --host "$HOST" --port "$PORT"
