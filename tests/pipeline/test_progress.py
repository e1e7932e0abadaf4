"""Progress for logs: plain lines at a bounded rate, and never quiet for longer than the interval."""

from __future__ import annotations

from cic.pipeline.run.progress import ProgressLines


def test_lines_every_tenth_and_at_the_end_not_per_event() -> None:
    now, lines = [0.0], []
    progress = ProgressLines(lines.append, clock=lambda: now[0])
    for done in range(0, 1001):
        now[0] += 0.01  # fast events: 1,001 of them in 10 s
        progress("score", done, 1000)
    assert len(lines) == 11  # start, every 10%, the end (never one per event)
    assert lines[0].startswith("score: 0/1000 (0.0%)") and lines[-1].startswith("score: 1000/1000 (100.0%)")
    assert "ETA" in lines[5] and "ETA" not in lines[-1]


def test_the_end_of_a_stage_is_one_line_however_often_it_is_reported() -> None:
    now, lines = [0.0], []
    progress = ProgressLines(lines.append, clock=lambda: now[0])
    for done in (0, 3, 10, 10, 10, 10):  # a pool reporting its count once per finished future, after the last
        now[0] += 1
        progress("log", done, 10)
    assert [line.split(" ·")[0] for line in lines] == ["log: 0/10 (0.0%)", "log: 3/10 (30.0%)", "log: 10/10 (100.0%)"]


def test_a_quiet_stage_is_repeated_every_interval() -> None:
    now, lines = [0.0], []
    progress = ProgressLines(lines.append, every_seconds=30, clock=lambda: now[0])
    progress("answer m", 3, 100)
    for _ in range(10):  # a long batch: no event for 100 s
        now[0] += 10
        progress.tick()
    assert len(lines) == 1 + 3  # the first line, then one at 30, 60 and 90 s
    progress("answer m", 100, 100)
    now[0] += 60
    progress.tick()
    assert len(lines) == 5  # a finished stage is not repeated


def test_the_first_report_of_a_stage_shows_no_rate_and_later_rates_count_from_it() -> None:
    now, lines = [100.0], []
    progress = ProgressLines(lines.append, clock=lambda: now[0])
    progress("answer m", 10, 100)  # the first batch lands: no time base yet
    now[0] += 20
    progress("answer m", 30, 100)
    assert lines[0] == "answer m: 10/100 (10.0%)"
    assert lines[1].startswith("answer m: 30/100 (30.0%) · 1.00/s · 20s elapsed · ETA 1m10s")


def test_a_stage_says_nothing_before_start_after_s_then_goes_on_as_usual() -> None:
    now, lines = [0.0], []
    progress = ProgressLines(lines.append, every_seconds=30, start_after_s=5, clock=lambda: now[0])
    progress("quick", 0, 4)
    now[0] += 1
    progress("quick", 4, 4)  # done within 5 s: not a line
    progress("evaluate", 0, 100)
    for done in range(1, 101):
        now[0] += 0.125
        progress("evaluate", done, 100)
    assert lines[0].startswith("evaluate: 40/100 (40.0%)")  # the first report after 5 s
    assert lines[-1].startswith("evaluate: 100/100 (100.0%)") and not any(line.startswith("quick") for line in lines)
    progress("slow", 0, 1)
    now[0] += 31
    progress.tick()
    assert lines[-1].startswith("slow: 0/1 (0.0%)")  # a stage quiet past the interval is said by the tick
