"""Shared fixtures: isolated Prefect state and model cache per session; reproducible random (score, error) tables."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

# Every test session gets its own Prefect state (ephemeral API database, settings) and never talks to a
# server a developer may have configured; set before anything imports prefect.
_PREFECT_HOME = tempfile.mkdtemp(prefix="cic-test-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.pop("PREFECT_API_URL", None)
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "true"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"
# One converted-model cache for the session ($CIC_CACHE_DIR if the caller set one): every test and every `cic`
# process a test starts converts SmolLM2 at most once, and a developer's ~/.cache/cic is never touched.
_OWN_CACHE = "CIC_CACHE_DIR" not in os.environ
os.environ.setdefault("CIC_CACHE_DIR", tempfile.mkdtemp(prefix="cic-test-cache-"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_PREFECT_HOME, ignore_errors=True)
    if _OWN_CACHE:
        shutil.rmtree(os.environ["CIC_CACHE_DIR"], ignore_errors=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


pytest_plugins = ["tests.support.model_fixtures", "tests.support.prefect_server"]
