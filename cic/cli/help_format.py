"""Help a person reads: `FILE`, `TEXT`, `NUMBER` for values, nothing for a flag, `cic calibrate [OPTIONS] FILE`.

Typer shows a value's Python type (`<str>`, `<bool>` even for a flag) and a required argument as `{file}`; these
command and group classes give every parameter without an explicit metavar a conventional one instead.
"""

from __future__ import annotations

from typing import Any

import typer.core

VALUE_NAMES = {str: "TEXT", int: "INTEGER", float: "NUMBER", bool: "BOOLEAN"}


def _value_name(param: Any) -> str:
    """What a value of this option is called: PATH for paths, TEXT, INTEGER, NUMBER, or its choices."""
    described = param.type_descriptor
    if described.is_choice:
        return param.display_type(None).strip("<>")
    if described.is_path:
        return "PATH"
    element = described.annotation
    if described.is_list:
        element = getattr(element, "__args__", (str,))[0]
    return VALUE_NAMES.get(element, "TEXT") + ("..." if described.is_list else "")


def _no_type(ctx: Any) -> None:
    return None


def readable(params: list[Any]) -> list[Any]:
    """Give each parameter without a metavar a readable one (a flag: none); returns the same list."""
    for param in params:
        if isinstance(param, typer.core.TyperArgument):
            param.metavar = param.metavar or param.name.upper()
            param.display_type_rich = _no_type  # its name column already says FILE; no `<path>` beside it
        elif param.metavar is not None:
            continue
        elif getattr(param, "is_flag", False):
            param.metavar = ""
        elif hasattr(param, "type_descriptor"):
            param.metavar = _value_name(param)
    return params


class ReadableCommand(typer.core.TyperCommand):
    """A Typer command whose help names values as a person would (see the module docstring)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return readable(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = param.metavar + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class ReadableGroup(typer.core.TyperGroup):
    """A Typer group whose own options read the same way."""

    def get_params(self, ctx: Any) -> list[Any]:
        return readable(super().get_params(ctx))
