"""`infra/scripts/start_prefect_server.sh` on a port other than 4200: the UI it serves calls the API on that
port (the UI reads its API address from the server's /ui-settings)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support.prefect_server import ROOT, free_port, wait_healthy

pytestmark = pytest.mark.slow


def test_server_script_points_the_ui_at_its_own_port(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "CIC_PREFECT_PORT": str(port), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_UI_API_URL", None)
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "infra" / "scripts" / "start_prefect_server.sh")], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/api", proc, log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui-settings", timeout=10) as reply:
            settings = json.loads(reply.read())
        assert settings["api_url"] == f"http://127.0.0.1:{port}/api"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
