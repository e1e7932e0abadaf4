"""Progress as a person watches it: rich bars on a terminal, else a plain line per 10% of a stage (and at least
every 30 s), fed by `cic.pipeline.run.progress` — the same for `cic run`, `recalibrate`, `log` and `gate sync`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cic.cli.common import console, err_console
from cic.pipeline.run.progress import ProgressLines


class StageBars:
    """Rich progress bars, one per pipeline stage, fed by `cic.pipeline.run.progress`."""

    def __init__(self, *, on: Any = console, transient: bool = False) -> None:
        self.progress = Progress(TextColumn("{task.description:<28}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=on, transient=transient)
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=max(total, 1))
        self.progress.update(self.tasks[stage], completed=done if total else 1, total=max(total, 1))

    def __enter__(self) -> StageBars:
        from cic.pipeline.run import progress

        self.progress.start()
        self._unsubscribe = progress.subscribe(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._unsubscribe()
        self.progress.stop()


def progress_view() -> AbstractContextManager[Any]:
    """Bars on a terminal, lines in a log (a scheduled job, a pipe, CI)."""
    if console.is_terminal:
        return StageBars()
    return ProgressLines(lambda text: console.print(text, soft_wrap=True, highlight=False, markup=False))


def side_progress() -> AbstractContextManager[Any]:
    """Progress of a command whose output is a table or one line (`cic evaluate`, `cic ingest`): on stderr, so
    stdout stays what it was; on a terminal a bar that goes when done, in a log a line once a stage has run
    $CIC_PROGRESS_AFTER_S (default 5 s: a quick command stays quiet) and then every 10% or 30 s."""
    import os

    if err_console.is_terminal:
        return StageBars(on=err_console, transient=True)
    try:
        after = max(0.0, float(os.environ.get("CIC_PROGRESS_AFTER_S", "5")))
    except ValueError:
        after = 5.0
    return ProgressLines(lambda text: err_console.print(text, soft_wrap=True, highlight=False, markup=False),
                         start_after_s=after)
