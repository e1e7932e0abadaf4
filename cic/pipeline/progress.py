"""Stage progress: pipeline steps report (stage, done, total); a front end (the CLI's rich bars) listens.

The default listener does nothing, so library code and flows run silently unless a front end subscribes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, int, int], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    """Add a listener of (stage, done, total); returns the function that removes it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def report(stage: str, done: int, total: int) -> None:
    """Tell every listener that `done` of `total` units of `stage` are finished."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(stage, done, total)
