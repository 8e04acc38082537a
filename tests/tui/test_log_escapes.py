"""The dashboard's log views draw a workload's escape sequences as nothing, 8-bit C1 forms (U+009B CSI, U+009D
OSC) included: a terminal that takes C1 controls would otherwise clear the screen or set its title."""
from __future__ import annotations

import pytest

from tui.screens.log_screen import LogScreen
from tui.widgets.log_tail import LogTail
from tui.widgets.log_view import LogView

from .conftest import select_run, wait_for_rows, wait_for_screen, wait_until

pytestmark = pytest.mark.asyncio
HOSTILE = [
    "clip<\x1b]52;c;ZWNobyBwd25lZA==\x07>clip",
    "title<\x1b]0;pwned title\x07>title",
    "dsr<\x1b[6n>dsr",
    "clear<\x1b[2J\x1b[H>clear",
    "c1csi<\u009b6n\u009b2J>c1csi",
    "c1osc<\u009d0;pwned c1 title\u009c>c1osc",
    "c1bel<\u009d52;c;AAAA\x07>c1bel",
    "stray<\u0085\u009c>stray",
]
SHOWN = ["clip<>clip", "title<>title", "dsr<>dsr", "clear<>clear", "c1csi<>c1csi", "c1osc<>c1osc", "c1bel<>c1bel",
         "stray<>stray"]


def drawn(widget) -> list[str]:
    return [widget.render_line(y).text for y in range(widget.scrollable_content_region.height)]


def assert_inert(lines: list[str]) -> None:
    for line in lines:
        assert not any(ord(char) < 0x20 or 0x7f <= ord(char) <= 0x9f for char in line), repr(line)
        assert "pwned" not in line and "ZWNo" not in line, repr(line)


async def test_the_log_screen_draws_no_escape_sequence(app, source):
    source.set_log("r-0001", len(HOSTILE), lambda i: HOSTILE[i])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0001")
        await pilot.press("l")
        view = (await wait_for_screen(pilot, LogScreen, ready="LogView", what="the log screen")).query_one(LogView)
        await wait_until(pilot, lambda: view.line_count == len(HOSTILE) and not view.missing_lines(),
                         what="the lines")
        await pilot.pause()
        lines = drawn(view)
        assert_inert(lines)
        shown = [line.split(maxsplit=1)[1].strip() for line in lines if line.strip()]  # after the line number
        assert shown == SHOWN


async def test_the_main_screens_log_tail_draws_no_escape_sequence(app, source):
    source.update_run("r-0001", log_tail=tuple(HOSTILE))
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0001")
        tail = app.query_one(LogTail)
        await wait_until(pilot, lambda: any("clip<>clip" in line for line in drawn(tail)), what="the log tail")
        lines = drawn(tail)
        assert_inert(lines)
        assert [word for word in SHOWN if any(word in line for line in lines)] == SHOWN
