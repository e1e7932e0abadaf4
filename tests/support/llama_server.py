"""llama-cpp-python's OpenAI-compatible server on loopback, from a Python that has it installed: `CIC_LLAMA_PYTHON`
names that interpreter (the package is a ~16-minute source build, so it is not in the test extra). It serves a
GGUF under an alias, as `--model_alias` makes it list and answer; a test stops it and starts another file under
the same alias on the same port."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.local_servers import free_port, kill_group, wait_healthy

PYTHON_ENV = "CIC_LLAMA_PYTHON"


def llama_python() -> str | None:
    """The interpreter that runs the server (None: not configured, or it lacks llama_cpp.server)."""
    python = os.environ.get(PYTHON_ENV)
    if not python or not Path(python).exists():
        return None
    found = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True, timeout=60)
    return python if found.returncode == 0 else None


class LlamaServer:
    """`start(gguf)` waits (≤ 120 s) until `GET /v1/models` answers; `url` is the base URL (…/v1)."""

    def __init__(self, log: Path, *, alias: str | None = None, port: int | None = None) -> None:
        self.log, self.alias, self.port = log, alias, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self, gguf: Path) -> LlamaServer:
        python = llama_python()
        assert python is not None, f"{PYTHON_ENV} names no Python with llama_cpp.server"
        alias = ["--model_alias", self.alias] if self.alias else []
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", str(gguf), *alias,
                                          "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048"],
                                         stdout=log, stderr=log, start_new_session=True,
                                         env={**os.environ, "OMP_NUM_THREADS": "2"})
        wait_healthy(f"{self.url}/models", self.proc, 120, lambda: self.log.read_text()[-2000:])
        return self

    def stop(self) -> None:
        kill_group(self.proc)
