"""A non-editable install carries what `cic run` needs: the shipped configs and dataset samples, outside the repo."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_wheel_installs_with_its_configs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("cic-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("cic/pipeline/configs/demo.yaml", "cic/pipeline/configs/paper.yaml",
                    "cic/data/samples/trivia_qa_validation.jsonl", "flows/pipeline.py", "tasks/answer.py"):
        assert shipped in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # the wheel alone in the new environment; its dependencies come from this one (their .pth files unread, so
    # the editable checkout of cic stays invisible)
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    (Path(target) / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    code = ("import cic, cic.pipeline.config as c; cfg = c.load_config('demo'); "
            "print(cic.__file__); print(cfg.name, c.config_path('demo'))")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    where, line = proc.stdout.strip().splitlines()
    assert where.startswith(target)
    assert line.startswith("demo ") and line.endswith("cic/pipeline/configs/demo.yaml") and target in line
    show = "import sys; from cic.cli import app; sys.argv = ['cic', 'run', '--help']; app()"
    help_text = subprocess.run([str(python), "-c", show], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                               env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert help_text.returncode == 0 and "shipped config" in help_text.stdout, help_text.stderr
