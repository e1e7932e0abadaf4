"""The test tiers select what tests/README.md says: the fast tier skips importing all-slow modules, and selects
exactly the tests it would select by importing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _selected(markexpr: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-m", markexpr], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return sorted(line for line in proc.stdout.splitlines() if "::" in line)


@pytest.mark.slow
def test_the_fast_tier_selects_the_same_tests_without_importing_all_slow_modules() -> None:
    """`-m "not slow"` leaves modules marked slow as a whole uncollected (`pytest_ignore_collect` in conftest);
    the same expression spelled otherwise collects every module and deselects: both select the same tests."""
    fast = _selected("not slow")
    assert len(fast) > 500 and fast == _selected("not slow and not slow")


@pytest.mark.parametrize(("markexpr", "per_two_cores"), [("not slow", 2), ("", 3), ("slow", 3), ("faults", 3)])
def test_auto_workers_are_one_per_core_for_the_fast_tier_and_one_and_a_half_otherwise(
        markexpr: str, per_two_cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-n auto` (pyproject's default) spawns one worker per core for the CPU-bound fast tier and half as many
    again for a selection with the slow tier, whose services leave cores idle."""
    import os

    from tests.conftest import pytest_xdist_auto_num_workers

    class Options:
        def getoption(self, name: str) -> str:
            assert name == "markexpr"
            return markexpr

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert pytest_xdist_auto_num_workers(Options()) == per_two_cores  # type: ignore[arg-type]
