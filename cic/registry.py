"""One registry type for everything CIC looks up by name: bounds, searches, estimators, baselines, prompts,
datasets, engines, report metrics and validity scenarios.

A `Registry` is a mapping from name to entry with one lookup (`lookup`: names are matched without case
or surrounding spaces, aliases resolved) and one error text naming the field, the value and the choices, and it
takes entries of a user's own (`register`). It imports nothing of CIC but its errors, so every layer can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from cic.errors import UserError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name. `field` is what a user's setting is called in errors ("search", "bound", ...)."""

    def __init__(self, field: str, entries: Iterable[T] | Mapping[str, T] = (), *,
                 name_of: Callable[[T], str] = lambda entry: entry.name,  # type: ignore[attr-defined]
                 aliases: Mapping[str, str] | None = None, hint: str = "") -> None:
        self.field = field
        self.hint = hint  # said after the choices in the error (e.g. "or multistart[S]")
        self._name_of = name_of
        self._aliases = {self._key(a): self._key(n) for a, n in (aliases or {}).items()}
        items = entries.items() if isinstance(entries, Mapping) else ((name_of(e), e) for e in entries)
        self._entries: dict[str, T] = {}
        for name, entry in items:
            self._add(name, entry)

    @staticmethod
    def _key(name: str) -> str:
        return name.strip().lower()

    def _add(self, name: str, entry: T, replace: bool = False) -> T:
        key = self._key(name)
        if key in self._entries and not replace:
            raise UserError(f"{self.field} {name!r} is already registered; pass replace=True to override it")
        self._entries[key] = entry
        return entry

    def register(self, entry: T, *, name: str | None = None, replace: bool = False) -> T:
        """Add an entry of one's own (under `name`, else its own name); an existing name is an error unless
        `replace=True`."""
        return self._add(name if name is not None else self._name_of(entry), entry, replace)

    def alias(self, *aliases: str, to: str) -> None:
        """Let each of `aliases` name the entry `to` as well."""
        for alias in aliases:
            self._aliases[self._key(alias)] = self._key(to)

    def _resolve(self, name: Any) -> str | None:
        """The registered key `name` stands for (case and spaces ignored, aliases resolved), or None."""
        if not isinstance(name, str):
            return None
        key = self._key(name)
        key = self._aliases.get(key, key)
        return key if key in self._entries else None

    def find(self, name: Any) -> T | None:
        """The entry `name` names, or None."""
        key = self._resolve(name)
        return None if key is None else self._entries[key]

    def lookup(self, name: Any, field: str | None = None) -> T:
        """The entry `name` names; a UserError naming the field (`field`, else the registry's), the value and the
        choices otherwise."""
        key = self._resolve(name)
        if key is None:
            raise UserError(self.unknown(name, field))
        return self._entries[key]

    def unknown(self, name: Any, field: str | None = None) -> str:
        """The one error text for a name that is not registered."""
        aliases = f" (aliases: {', '.join(sorted(self._aliases))})" if self._aliases else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{field or self.field} = {name!r}: unknown; choose one of {', '.join(self._entries)}{aliases}{hint}"

    def __getitem__(self, name: str) -> T:
        key = self._resolve(name)
        if key is None:
            raise KeyError(name)
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return self._resolve(name) is not None

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (registering into it leaves this one as it is)."""
        out: Registry[T] = Registry(self.field, dict(self._entries), name_of=self._name_of, hint=self.hint)
        out._aliases = dict(self._aliases)
        return out
