"""Rebuild the bundled offline samples from full copies of the datasets (deterministic: same input, same bytes).

The samples under `cic/data/samples/` are `SAMPLE_SIZE` rows of each validation file chosen by
`np.random.default_rng(SAMPLE_SEED)` without replacement, copied verbatim (line for line) in file order.
Run `python -m cic.data.bundle SHARED_DATA_DIR` to regenerate them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from cic.errors import UserError

SAMPLE_SIZE = 300
SAMPLE_SEED = 0
SOURCES: dict[str, str] = {  # bundled file name -> path of the full copy under the shared data directory
    "commonsense_qa_validation.jsonl": "commonsense_qa/commonsense_qa_validation.jsonl",
    "trivia_qa_validation.jsonl": "trivia_qa/triviaqa_rc_nocontext_validation_first4000_ascii.jsonl",
}


def sample_lines(lines: list[str], size: int = SAMPLE_SIZE, seed: int = SAMPLE_SEED) -> list[str]:
    """`size` of the lines chosen by a seeded generator, kept in their original order."""
    if size > len(lines):
        raise UserError(f"size = {size}: the source has only {len(lines)} lines")
    keep = np.sort(np.random.default_rng(seed).choice(len(lines), size=size, replace=False))
    return [lines[i] for i in keep]


def write_samples(shared_dir: Path, out_dir: Path, size: int = SAMPLE_SIZE, seed: int = SAMPLE_SEED) -> list[Path]:
    """Write every bundled sample file from the full copies in `shared_dir`; returns the paths written."""
    written = []
    for name, relative in SOURCES.items():
        source = shared_dir / relative
        if not source.is_file():
            raise UserError(f"shared data file {str(source)!r} does not exist")
        lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        target = out_dir / name
        target.write_text("\n".join(sample_lines(lines, size, seed)) + "\n", encoding="utf-8")
        written.append(target)
    return written


if __name__ == "__main__":  # pragma: no cover - maintenance script
    for path in write_samples(Path(sys.argv[1]), Path(__file__).parent / "samples"):
        print(f"wrote {path}")
