"""Shared fixtures: isolated Prefect state and model cache per session; reproducible random (score, error) tables."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

# Each xdist worker gets its share of the cores for torch / BLAS threads (set before numpy or torch is
# imported): two workers each spinning threads for every core run the model tests several times slower.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _THREADS = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CIC_REPORT_WORKERS"):
        os.environ.setdefault(_variable, _THREADS)  # report workers too: the xdist workers already fill the cores

import numpy as np  # noqa: E402
import pytest

# A table's width never depends on the terminal pytest runs in (xdist workers get COLUMNS=80): tests that print
# tables through CliRunner see a pipe's width, and tests that need another set COLUMNS themselves.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# The modules that take minutes (real servers, model runs, kills) go to the workers first, so the short ones fill
# the gaps at the end instead of one worker finishing a long module alone (scheduling only: a module missing
# here runs in its normal place).
LONG_MODULES = ("tests/flows/test_pipeline_e2e.py", "tests/journeys/test_journeys.py", "tests/journeys/test_readme.py",
                "tests/cli/test_run_command.py", "tests/flows/test_flows.py", "tests/flows/test_prefect_deployment.py",
                "tests/flows/test_cluster.py", "tests/flows/test_prefect_ui.py", "tests/llm/test_generation.py",
                "tests/cli/test_error_lines.py", "tests/services/test_mlflow_artifacts.py",
                "tests/llm/test_answering.py", "tests/llm/test_endpoint.py",
                # the fast tier's longest (10-28 CPU-s each) first too, or the last of them runs alone at the end
                "tests/store/test_store.py", "tests/pipeline/test_system_gates.py", "tests/stats/test_calibration.py",
                "tests/llm/test_nucleus_bins.py", "tests/pipeline/test_gates.py", "tests/pipeline/test_certificates.py",
                "tests/store/test_harness.py", "tests/cli/test_output_paths.py", "tests/pipeline/test_ingest.py")

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
# The MLflow servers tests start run no job runner (its two huey consumers and periodic tasks serve MLflow's own
# GenAI jobs, which CIC never submits, and cost more CPU than the tracking server itself)
os.environ["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
# One converted-model cache for the session ($CIC_CACHE_DIR if the caller set one): every test and every `cic`
# process a test starts converts SmolLM2 at most once, and a developer's ~/.cache/cic is never touched.
_OWN_CACHE = "CIC_CACHE_DIR" not in os.environ
os.environ.setdefault("CIC_CACHE_DIR", tempfile.mkdtemp(prefix="cic-test-cache-"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_PREFECT_HOME, ignore_errors=True)
    if _OWN_CACHE:
        shutil.rmtree(os.environ["CIC_CACHE_DIR"], ignore_errors=True)


# fixtures that start a real service or load a model: a test using one is in the slow tier, whatever it is marked
SERVICE_FIXTURES = frozenset({"prefect_api", "server", "mlflow_server", "cluster", "demo_run", "smollm", "minilm"})


# a module that marks all its tests slow (`pytestmark = ... pytest.mark.slow ...` on one line)
_SLOW_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier (`-m "not slow"` exactly) does not import a module whose every test is slow: each of its
    tests would be deselected anyway, and its imports (Prefect, Ray, MLflow, servers) cost every worker seconds."""
    if config.getoption("markexpr") != "not slow" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    return True if _SLOW_MODULE.search(collection_path.read_text()) else None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for `-n auto` (pyproject's default): one per core for the fast tier, which computes all the time;
    half as many again for anything with the slow tier, whose server starts, health polls and subprocess waits
    leave a core idle (the whole suite on this 2-core machine: 1,050 s with 3 workers, 1,235-1,407 s with 2,
    1,130 s with 4)."""
    cores = os.cpu_count() or 1
    return cores if config.getoption("markexpr") == "not slow" else cores + cores // 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {module: place for place, module in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: order within a module
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


pytest_plugins = ["tests.support.model_fixtures", "tests.support.prefect_server"]

# files other tools wrote or read (a harness's task module imports that harness): never collected or doctested
collect_ignore_glob = ["fixtures/*"]
