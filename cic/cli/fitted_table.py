"""Tables that fit the console without breaking a word: a table whose columns fit at their longest word prints as
rich draws it (values wrap between words); one that does not prints as one block per row, its `column: value`
parts packed on lines that break between parts — never a value cut to "…" or folded inside a word. Every table a
`cic` console prints goes through `fitted` (`cic.cli.common.StreamConsole`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

LEAD = "cic_lead"  # a table's attribute: how many leading values open its block (one line, no names)


def plain_table(title: str, columns: Sequence[str], cells: Sequence[Sequence[str]], lead: int = 3) -> Table:
    """The rows `cells` under `columns`, borderless; where it does not fit, each row's block opens with its first
    `lead` values on one line."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        table.add_column(name)
    for row in cells:
        table.add_row(*row)
    setattr(table, LEAD, lead)
    return table


def fitted(table: Table, console: Any) -> list[Text] | None:
    """None when `table` fits `console` with every word whole (print it as it is); else its blocks' lines."""
    columns = table.columns
    longest = [max(_longest_word(v) for v in [c.header, *c.cells]) for c in columns]
    slack = console.width - sum(longest) - table._extra_width - sum(map(table._get_padding_width, range(len(columns))))
    if slack >= 0:  # every column at its longest word; what is left widens those whose values would wrap
        whole = [max(len(_plain(v)) for v in [c.header, *c.cells]) for c in columns]
        widths = list(longest)
        for i in sorted(range(len(columns)), key=lambda i: whole[i] - longest[i]):
            widths[i] += min(slack, whole[i] - longest[i])
            slack -= widths[i] - longest[i]
        for column, width in zip(columns, widths, strict=True):
            column.width, column.overflow = width, "fold"  # no narrower than its longest word: nothing folds
        return None
    lead = getattr(table, LEAD, 0)
    names = [_plain(c.header) for c in table.columns]
    lines = [] if table.title is None else [Text(_plain(table.title))]
    for row in zip(*(list(c.cells) for c in table.columns), strict=True):
        values = [_plain(v) for v in row]
        opening = ["  ".join(values[:lead])] if lead else []
        lines += [Text(line) for line in packed(opening + [f"{n}: {v}" for n, v in zip(names[lead:], values[lead:],
                                                                                       strict=True)], console.width)]
    return lines


def _longest_word(value: Any) -> int:
    return max((len(word) for word in _plain(value).split()), default=0)


def _plain(value: Any) -> str:
    text = value.plain if isinstance(value, Text) else str(value)
    return " ".join(text.split())


def packed(parts: list[str], width: int, indent: str = "    ", gap: str = "   ") -> list[str]:
    """`parts` on as few lines of `width` as fit whole parts: a line breaks between parts, never inside one."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + len(gap) + len(part) <= width and len(lines) > 1:
            lines[-1] += gap + part
        else:
            lines.append(indent + part)
    return lines
