"""`l`: the full-log screen asks the source only for the visible lines, even of a 5-million-line log."""
from __future__ import annotations

import threading

import pytest

from tui.screens.log_screen import LogScreen
from tui.screens.main_screen import MainScreen
from tui.widgets.log_view import LogView

from .conftest import screen_lines, select_run, wait_for_rows, wait_for_screen, wait_until

pytestmark = pytest.mark.asyncio
LINES = 5_000_000


def shown_lines(view: LogView) -> list[str]:
    return [view.render_line(y).text for y in range(view.scrollable_content_region.height)]


async def open_log(pilot, source, run_id: str, *, lines: int = LINES) -> LogView:
    await wait_for_rows(pilot, 4)
    await select_run(pilot, run_id)
    await pilot.press("l")
    view = (await wait_for_screen(pilot, LogScreen, ready="LogView", what="the log screen")).query_one(LogView)
    await wait_until(pilot, lambda: view.line_count == lines, what="the line count")
    return view


async def settle(pilot, view: LogView) -> None:
    await pilot.pause(0.05)
    await wait_until(pilot, lambda: not view.missing_lines(), what="the visible lines")
    await pilot.pause()


async def test_log_screen_requests_only_visible_ranges(app, source):
    source.set_log("r-0001", LINES, lambda i: f"line {i}")
    async with app.run_test(size=(120, 40)) as pilot:
        view = await open_log(pilot, source, "r-0001")
        height = view.scrollable_content_region.height
        await settle(pilot, view)
        assert shown_lines(view)[-1].split() == [str(LINES), "line", str(LINES - 1)]  # opens at the end
        await pilot.press("home")
        await settle(pilot, view)
        assert shown_lines(view)[0].split() == ["1", "line", "0"]
        await pilot.press("pagedown")
        await settle(pilot, view)
        view.scroll_to(y=2_500_000, animate=False, immediate=True)
        await settle(pilot, view)
        assert shown_lines(view)[0].split() == ["2500001", "line", "2500000"]

        requests = list(source.log_requests)
        assert all(run_id == "r-0001" for run_id, _, _ in requests)
        assert all(0 <= start < stop <= LINES and stop - start <= height for _, start, stop in requests), requests
        assert sum(stop - start for _, start, stop in requests) <= 5 * height
        starts = {start for _, start, _ in requests}
        assert {LINES - height, 0, 2_500_000} <= starts
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="back to the main screen")


async def test_log_screen_follows_a_growing_log(app, source):
    source.set_log("r-0001", LINES, lambda i: f"line {i}")
    async with app.run_test(size=(120, 40)) as pilot:
        view = await open_log(pilot, source, "r-0001")
        await settle(pilot, view)
        source.set_log("r-0001", LINES + 3, lambda i: f"line {i}")
        await wait_until(pilot, lambda: view.line_count == LINES + 3, what="the new count")
        await settle(pilot, view)
        assert shown_lines(view)[-1].split() == [str(LINES + 3), "line", str(LINES + 2)]
        # Only the three new lines were fetched after the first window.
        assert source.log_requests[-1][1:] == (LINES, LINES + 3)


async def test_log_screen_highlights_exceptions(app, source):
    traceback = ["step=1 loss=1.0", "Traceback (most recent call last):", '  File "x.py", line 3, in f',
                 "    boom()", "ValueError: bad"]
    source.set_log("r-0001", LINES, lambda i: traceback[i % 5])
    async with app.run_test(size=(120, 40)) as pilot:
        view = await open_log(pilot, source, "r-0001")
        await settle(pilot, view)
        # The source finds the traceback after the screen opened: `boom()` matches no pattern on its own.
        source.update_run("r-0001", exception_texts=("\n".join(traceback[1:]),))
        await wait_until(pilot, lambda: app.screen.run.exception_texts, what="the snapshot on the log screen")
        await pilot.pause()
        for y in range(5):
            strip = view.render_line(y)
            red = any(seg.style is not None and seg.style.color is not None and seg.style.color.name == "red"
                      for seg in strip)
            assert red == ("step=" not in strip.text), strip.text


async def test_log_screen_survives_a_failing_source_and_recovers(app, source, monkeypatch):
    source.set_log("r-0001", 100, lambda i: f"line {i}")
    real_log_lines = source.log_lines
    failures = []
    broken = threading.Event()
    broken.set()

    def failing_while_broken(run_id, start, stop):
        if broken.is_set():
            failures.append((start, stop))
            raise ConnectionError("pve1 unreachable")
        return real_log_lines(run_id, start, stop)

    monkeypatch.setattr(source, "log_lines", failing_while_broken)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await pilot.press("l")
        view = (await wait_for_screen(pilot, LogScreen, ready="LogView", what="the log screen")).query_one(LogView)
        await wait_until(pilot, lambda: failures, what="the failing request")
        await pilot.pause(0.2)
        assert view.missing_lines()  # nothing to show yet, and the screen is still up
        assert isinstance(app.screen, LogScreen)
        broken.clear()
        source.set_log("r-0001", 101, lambda i: f"line {i}")  # the next count change asks again
        await settle(pilot, view)
        assert shown_lines(view)[-1].split() == ["101", "line", "100"]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_log_screen_opens_on_the_last_line_of_a_log_wider_than_the_screen(app, source, size):
    """Lines wider than the screen bring a horizontal scrollbar once they arrive, one row less to show: the view
    that follows the end must still end on the log's last line."""
    count = 300
    source.set_log("r-0001", count, lambda i: f"line {i} " + "x" * 200)
    async with app.run_test(size=size) as pilot:
        view = await open_log(pilot, source, "r-0001", lines=count)
        await settle(pilot, view)
        shown = [line for line in shown_lines(view) if line.strip()]
        assert shown[-1].split()[:3] == [str(count), "line", str(count - 1)], shown[-3:]
        assert all("…" not in line for line in shown)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_log_screen_asks_first_for_the_lines_it_opens_on(app, source, size):
    """It opens at the end: asking first for the top left every line a placeholder until a second answer."""
    count = 300
    source.set_log("r-0001", count, lambda i: f"line {i}")
    async with app.run_test(size=size) as pilot:
        view = await open_log(pilot, source, "r-0001", lines=count)
        await settle(pilot, view)
        height = view.scrollable_content_region.height
        assert source.log_requests[0] == ("r-0001", count - height, count), source.log_requests


async def test_log_screen_says_it_is_loading_until_the_lines_arrive(app, source, monkeypatch):
    """Over SSH the count and the lines take a moment: the pane says so instead of showing nothing or bare `…`."""
    source.set_log("r-0001", 30, lambda i: f"line {i}")
    count_sent, lines_sent = threading.Event(), threading.Event()
    real_count, real_lines = source.log_line_count, source.log_lines
    monkeypatch.setattr(source, "log_line_count", lambda run_id: count_sent.wait(10) and real_count(run_id))
    monkeypatch.setattr(source, "log_lines", lambda *args: lines_sent.wait(10) and real_lines(*args))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_rows(pilot, 4)
        await pilot.press("l")
        view = (await wait_for_screen(pilot, LogScreen, ready="LogView", what="the log screen")).query_one(LogView)
        await pilot.pause(0.1)
        assert any("loading the log" in line for line in screen_lines(app))
        count_sent.set()
        await wait_until(pilot, lambda: view.line_count == 30, what="the line count")
        await pilot.pause(0.1)
        rows = [line.strip() for line in screen_lines(app)[1:-1] if line.strip()]
        assert rows and all(row.split()[1] == "loading…" for row in rows), rows
        lines_sent.set()
        await settle(pilot, view)
        assert screen_lines(app)[-2].split()[:3] == ["30", "line", "29"]
        assert not any("loading" in line for line in screen_lines(app))
