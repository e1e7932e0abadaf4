"""Engines by name: a new backend is one module in this package and one line here (imported only when used, so
a served model's worker never imports torch's generation loop)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from cic.registry import Registry

if TYPE_CHECKING:
    from cic.llm.engines.base import Engine
    from cic.llm.settings import AnswererSettings

ENGINES: Registry[str] = Registry("engine", {
    "local": "cic.llm.engines.local:LocalEngine",          # weights CIC loads (transformers, GGUF)
    "endpoint": "cic.llm.engines.endpoint:EndpointEngine",  # an OpenAI-compatible server
})


def engine_class(name: str) -> type[Engine]:
    """The engine registered as `name`; a UserError naming the ones there are otherwise."""
    module, _, attribute = ENGINES.lookup(name).partition(":")
    return getattr(import_module(module), attribute)


def make_engine(settings: AnswererSettings) -> Engine:
    """The engine a worker answers with, built from its settings (not loaded yet)."""
    return engine_class(settings.engine)(settings)
