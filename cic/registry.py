"""One registry type for everything CIC looks up by name: bounds, searches, estimators, baselines, prompts,
datasets, engines, report metrics and validity scenarios.

A `Registry` is a mapping from name to entry with one lookup (`lookup`: names are matched without case
or surrounding spaces, aliases resolved) and one error text naming the field, the value and the choices, and it
takes entries of a user's own (`register`, also as a decorator; `unregister`). With `base` every entry is checked
to be one (an instance of it, or for a registry of classes a subclass) when it is registered. With `group` it also
takes entries from other installed packages: each entry point of that group (`[project.entry-points."cic.bounds"]`
in a plug-in's pyproject.toml) is loaded the first time the registry is read and registered under the entry
point's name; a plug-in that fails to load is named, with why, when its name is asked for. It imports nothing of
CIC but its errors, so every layer can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from cic.errors import UserError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name. `field` is what a user's setting is called in errors ("search", "bound", ...)."""

    def __init__(self, field: str, entries: Iterable[T] | Mapping[str, T] = (), *,
                 name_of: Callable[[T], str] = lambda entry: entry.name,  # type: ignore[attr-defined]
                 aliases: Mapping[str, str] | None = None, hint: str = "",
                 base: type | tuple[type, ...] | None = None, group: str | None = None) -> None:
        self.field = field
        self.hint = hint  # said after the choices in the error (e.g. "or multistart[S]")
        self.base, self.group = base, group
        self._name_of = name_of
        self._aliases = {self._key(a): self._key(n) for a, n in (aliases or {}).items()}
        items = entries.items() if isinstance(entries, Mapping) else ((name_of(e), e) for e in entries)
        self._entries: dict[str, T] = {}
        self._plugged = group is None  # entry points read (none to read without a group)
        self._broken: dict[str, str] = {}  # plug-in name -> why it did not load
        for name, entry in items:
            self._add(name, entry)

    @staticmethod
    def _key(name: str) -> str:
        return name.strip().lower()

    def _check(self, name: str, entry: Any) -> None:
        """An entry of the registry's `base`: an instance, or a subclass where the base entries are classes."""
        if self.base is None or isinstance(entry, self.base) or (
                isinstance(entry, type) and issubclass(entry, self.base)):
            return
        kinds = self.base if isinstance(self.base, tuple) else (self.base,)
        wanted = " or ".join(f"{k.__module__}.{k.__qualname__}" for k in kinds)
        raise UserError(f"{self.field} {name!r}: {entry!r} is not a {wanted}; register one")

    def _add(self, name: str, entry: T, replace: bool = False) -> T:
        key = self._key(name)
        if not key:
            raise UserError(f"{self.field} name {name!r}: empty; give the entry a name")
        self._check(name, entry)
        if key in self._entries and not replace:
            raise UserError(f"{self.field} {name!r} is already registered; pass replace=True to override it")
        self._entries[key] = entry
        return entry

    @overload
    def register(self, entry: T, *, name: str | None = None, replace: bool = False) -> T: ...
    @overload
    def register(self, entry: None = None, *, name: str | None = None,
                 replace: bool = False) -> Callable[[T], T]: ...

    def register(self, entry: T | None = None, *, name: str | None = None, replace: bool = False) -> Any:
        """Add an entry of one's own (under `name`, else its own name); an existing name is an error unless
        `replace=True`. Without an entry, a decorator: `@ENGINES.register(name="mine")` over a class."""
        if entry is None:
            return lambda given: self.register(given, name=name, replace=replace)
        self._plug()  # a plug-in's name registered later must not silently replace this one
        return self._add(name if name is not None else self._name_of(entry), entry, replace)

    def unregister(self, name: str) -> T:
        """Remove the entry `name` names (and the aliases pointing at it); returns it."""
        key = self._resolve(name)
        if key is None:
            raise UserError(self.unknown(name))
        self._aliases = {a: k for a, k in self._aliases.items() if k != key}
        return self._entries.pop(key)

    def _plug(self) -> None:
        """Register every entry point of `group` once (their names, each entry checked like any other)."""
        if self._plugged:
            return
        self._plugged = True
        from importlib.metadata import entry_points

        for point in sorted(entry_points(group=self.group or ""), key=lambda p: p.name):
            try:
                self._add(point.name, point.load())
            except Exception as exc:  # a third-party package: whatever it raises, name it and go on
                self._broken[self._key(point.name)] = (f"plug-in {point.name!r} ({point.value}, entry point group "
                                                       f"{self.group}) did not load: {exc}")

    def alias(self, *aliases: str, to: str) -> None:
        """Let each of `aliases` name the entry `to` as well."""
        for alias in aliases:
            self._aliases[self._key(alias)] = self._key(to)

    def _resolve(self, name: Any) -> str | None:
        """The registered key `name` stands for (case and spaces ignored, aliases resolved), or None; plug-ins
        are read only for a name not registered yet (a built-in name never loads a third party's package)."""
        if not isinstance(name, str):
            return None
        key = self._key(name)
        key = self._aliases.get(key, key)
        if key not in self._entries and not self._plugged:
            self._plug()
            key = self._aliases.get(self._key(name), self._key(name))
        return key if key in self._entries else None

    def names(self, *, plugins: bool = True) -> tuple[str, ...]:
        """The registered names; `plugins=False`: those registered so far, without reading entry points (what a
        module lists of its own at import)."""
        if plugins:
            self._plug()
        return tuple(self._entries)

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
        self._plug()
        if isinstance(name, str) and self._key(name) in self._broken:
            return f"{field or self.field} = {name!r}: {self._broken[self._key(name)]}"
        aliases = f" (aliases: {', '.join(sorted(self._aliases))})" if self._aliases else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{field or self.field} = {name!r}: unknown; choose one of {', '.join(self._entries)}{aliases}{hint}"

    def __getitem__(self, name: str) -> T:
        key = self._resolve(name)
        if key is None:
            raise KeyError(name)
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        self._plug()
        return iter(self._entries)

    def __len__(self) -> int:
        self._plug()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return self._resolve(name) is not None

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (registering into it leaves this one as it is)."""
        self._plug()
        out: Registry[T] = Registry(self.field, dict(self._entries), name_of=self._name_of, hint=self.hint,
                                    base=self.base)
        out._aliases, out._broken = dict(self._aliases), dict(self._broken)
        return out
