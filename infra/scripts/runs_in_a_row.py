"""`cic run` as a new user runs it, N times in a row, each in a fresh directory: exit code, seconds in all, seconds
between the last line and the exit, console lines.

    .venv/bin/python infra/scripts/runs_in_a_row.py [--runs 5] [--keep DIR] [-- extra cic run arguments]

Prints one line per run and a last line saying whether every run exited 0 within 10 s of its last line (exit 1
otherwise), so "exits 0 within seconds of its last stage, five times in a row" is a command, not a claim.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CIC = Path(sys.executable).with_name("cic")
WITHIN_S = 10.0


def one_run(cwd: Path, extra: list[str]) -> tuple[int, float, float, int]:
    """(exit code, seconds in all, seconds from the last line to the exit, lines) of one `cic run` in `cwd`."""
    start = time.monotonic()
    last, lines = start, 0
    with (cwd / "console.txt").open("w") as console:
        proc = subprocess.Popen([str(CIC), "run", *extra], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            last, lines = time.monotonic(), lines + 1
            console.write(line)
        code = proc.wait()
    end = time.monotonic()
    return code, end - start, end - last, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="run in DIR/run-<i> and keep them (default: temporary)")
    parser.add_argument("extra", nargs="*", help="arguments for `cic run` (after --)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs = {args.runs}: at least 1")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep = {str(args.keep)!r}: not empty; each run needs a fresh directory")
    ok = True
    with tempfile.TemporaryDirectory(prefix="cic-runs-") as tmp:
        root = args.keep or Path(tmp)
        for i in range(1, args.runs + 1):
            cwd = root / f"run-{i}"
            cwd.mkdir(parents=True, exist_ok=False)
            code, total, gap, lines = one_run(cwd, args.extra)
            ok &= code == 0 and gap <= WITHIN_S
            print(f"run {i}: exit {code}, {total:.1f} s in all, {gap:.1f} s from the last line to the exit, "
                  f"{lines} lines", flush=True)
    print(f"{args.runs} run(s): {'every one' if ok else 'NOT every one'} exited 0 within {WITHIN_S:g} s of its last "
          "line")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
