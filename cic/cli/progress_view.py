"""Progress as a person watches it: rich bars on a terminal, else a plain line per 10% of a stage (and at least
every 30 s), fed by `cic.pipeline.progress` — the same for `cic run`, `recalibrate`, `log` and `gate sync`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cic.cli.common import console
from cic.pipeline.progress import ProgressLines


class StageBars:
    """Rich progress bars, one per pipeline stage, fed by `cic.pipeline.progress`."""

    def __init__(self) -> None:
        self.progress = Progress(TextColumn("{task.description:<28}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=max(total, 1))
        self.progress.update(self.tasks[stage], completed=done if total else 1, total=max(total, 1))

    def __enter__(self) -> StageBars:
        from cic.pipeline import progress

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
