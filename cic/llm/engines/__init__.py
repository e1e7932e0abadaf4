"""Answer engines behind one interface (`base.Engine`), found by name (`registry`)."""

from cic.llm.engines.base import Capabilities, Engine
from cic.llm.engines.probe import EngineProbe
from cic.llm.engines.registry import ENGINES, engine_class, make_engine

__all__ = ["ENGINES", "Capabilities", "Engine", "EngineProbe", "engine_class", "make_engine"]
