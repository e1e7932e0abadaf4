"""Engines by name: a new backend is one module in this package and one line here (imported only when used, so
a served model's worker never imports torch's generation loop)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from cic.errors import UserError
from cic.registry import Registry

if TYPE_CHECKING:
    from cic.llm.engines.base import Engine
    from cic.llm.settings import AnswererSettings

#: name -> "module:Class" (imported when used) or the Engine class itself (a plug-in's, or `@ENGINES.register(name=…)`)
ENGINES: Registry[str | type] = Registry("engine", {
    "local": "cic.llm.engines.local:LocalEngine",          # weights CIC loads (transformers, GGUF)
    "endpoint": "cic.llm.engines.endpoint:EndpointEngine",  # an OpenAI-compatible server
}, name_of=lambda entry: entry.name, base=(str, type), group="cic.engines")


def engine_class(name: str) -> type[Engine]:
    """The engine registered as `name`; a UserError naming the ones there are otherwise, or saying that the entry is
    not an `Engine` of that name (a registry line pointing at the wrong class)."""
    from cic.llm.engines.base import Engine

    entry = ENGINES.lookup(name)
    if isinstance(entry, type):
        found: object = entry
    else:
        module, _, attribute = entry.partition(":")
        found = getattr(import_module(module), attribute, None)
    key = name.strip().lower()
    if not (isinstance(found, type) and issubclass(found, Engine)) or getattr(found, "name", None) != key:
        raise UserError(f"engine {key!r}: the registry names {entry!r}, which is not a cic.llm.engines.base.Engine "
                        f"whose name is {key!r}")
    return found


def make_engine(settings: AnswererSettings) -> Engine:
    """The engine a worker answers with, built from its settings (not loaded yet)."""
    return engine_class(settings.engine)(settings)
