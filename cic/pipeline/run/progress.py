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


class ProgressLines:
    """Plain progress lines for logs (a scheduled job, CI, nohup), at a bounded rate.

    A line when a stage starts, every `every_fraction` of it, when it ends, and — from a background thread —
    at least every `every_seconds` while a stage is unfinished, so a log never goes quiet during a long stage:
    "answer m: 120/1221 (9.8%) · 0.42/s · ETA 43m40s". With `start_after_s` a stage says nothing until it has run
    that long (a command whose output is a table stays clean when it is quick). `clock` is injectable for tests.
    """

    def __init__(self, write: Callable[[str], None], *, every_fraction: float = 0.1, every_seconds: float = 30.0,
                 start_after_s: float = 0.0, clock: Callable[[], float] | None = None) -> None:
        import time

        self.write = write
        self.every_fraction = every_fraction
        self.every_seconds = every_seconds
        self.start_after_s = start_after_s
        self.clock = clock or time.monotonic
        self._state: dict[str, tuple[int, int, float, float, float]] = {}  # done, total, start, last line, mark
        self._first: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, stage: str, done: int, total: int, started: float) -> str:
        elapsed = self.clock() - started
        share = f" ({100 * done / total:.1f}%)" if total else ""
        if elapsed < 1.0:  # no time base yet (the stage's first report): no rate, no ETA
            return f"{stage}: {done}/{total}{share}"
        rate = (done - self._first.get(stage, 0)) / elapsed
        eta = f" · ETA {_duration((total - done) / rate)}" if total and 0 < done < total and rate > 0 else ""
        return f"{stage}: {done}/{total}{share} · {rate:.2f}/s · {_duration(elapsed)} elapsed{eta}"

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        with self._lock:
            if stage not in self._state:
                self._first[stage] = done  # the rate counts what is done after the first report
            before, _, started, last, mark = self._state.get(stage, (-1, total, now, -1.0, -1.0))
            fraction = done / total if total else 1.0
            ends = done >= total and before < done  # the end once: repeated final reports add nothing
            due = (last < 0 or ends or fraction - mark >= self.every_fraction
                   or now - last >= self.every_seconds) and now - started >= self.start_after_s
            if due:
                last, mark = now, fraction
            self._state[stage] = (done, total, started, last, mark)
        if due:
            self.write(self.line(stage, done, total, started))

    def tick(self) -> None:
        """Repeat the line of every unfinished stage that has been quiet for `every_seconds`."""
        now = self.clock()
        with self._lock:
            quiet = [(s, d, t, st) for s, (d, t, st, last, _) in self._state.items()
                     if d < t and now - max(last, st) >= self.every_seconds and now - st >= self.start_after_s]
            for stage, *_ in quiet:
                d, t, st, _last, mark = self._state[stage]
                self._state[stage] = (d, t, st, now, mark)
        for stage, done, total, started in quiet:
            self.write(self.line(stage, done, total, started))

    def __enter__(self) -> ProgressLines:
        self._unsubscribe = subscribe(self)

        def run() -> None:
            while not self._stop.wait(min(5.0, self.every_seconds)):
                self.tick()

        self._thread = threading.Thread(target=run, name="cic-progress-lines", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._unsubscribe()
        self._stop.set()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
