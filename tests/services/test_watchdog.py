"""The watchdog is a plain script that starts in a fraction of a second: it imports no `cic` module, so a command
killed right after it started still has its children stopped."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

from cic.services import watchdog

ALLOWED = {"__future__", "contextlib", "os", "signal", "sys", "time", "typing", "psutil"}


def test_the_watchdog_imports_only_the_standard_library_and_psutil() -> None:
    tree = ast.parse(Path(watchdog.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= ALLOWED, imported - ALLOWED


def test_the_script_says_ready_then_exits_when_its_command_is_gone() -> None:
    """Run as the command runs it: READY on stdout once it holds the PID; an owner already ended ends it."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    import psutil

    started = psutil.Process(owner.pid).create_time()
    begun = time.monotonic()
    proc = subprocess.run([sys.executable, "-P", watchdog.__file__, str(owner.pid), repr(started)],
                          capture_output=True, text=True, timeout=30)
    owner.wait()
    assert proc.returncode == 0 and proc.stdout.splitlines() == [watchdog.READY], proc.stderr
    assert time.monotonic() - begun < 15
