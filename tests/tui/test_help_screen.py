"""`?` opens the list of every key, made from the bindings; `?`, escape and q close it."""
from __future__ import annotations

import pytest
from textual.binding import Binding
from textual.widgets import Static

from tui.screens.help_screen import HelpScreen
from tui.screens.log_screen import LogScreen
from tui.screens.main_screen import MainScreen

from .conftest import screen_lines, wait_for_rows, wait_for_screen, wait_until

pytestmark = pytest.mark.asyncio


async def open_help(pilot) -> HelpScreen:
    await pilot.press("question_mark")
    return await wait_for_screen(pilot, HelpScreen, ready="*", what="the help screen")


@pytest.mark.parametrize("close_key", ["question_mark", "escape", "q"])
async def test_question_mark_opens_help_and_its_key_closes_it(app, close_key):
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_rows(pilot, 4)
        await open_help(pilot)
        await pilot.press(close_key)
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="back on the main screen")
        assert app.return_code is None  # q closed the help, it did not quit


async def test_help_lists_every_binding_of_the_screens_and_prompts(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        help_screen = await open_help(pilot)
        lines = help_screen.query_one("#help-text", Static).content.plain.splitlines()
        for screen in (MainScreen, LogScreen):
            for binding in Binding.make_bindings(screen.BINDINGS):
                key = app.get_key_display(binding)
                assert any(key in line and line.rstrip().endswith(binding.description) for line in lines), \
                    (binding, lines)
        assert any(line.split() == ["?", "Help"] for line in lines)
        assert any(line.split()[:1] == ["k"] and line.endswith("Kill") for line in lines)
        assert any(line.split()[:3] == ["y", "/", "⏎"] and line.endswith("Yes") for line in lines)
        assert any(line.split()[:5] == ["?", "/", "esc", "/", "q"] for line in lines)
        assert sum("Focus Next" in line for line in lines) == 1  # keys of every screen once


async def test_every_entry_can_be_scrolled_into_view_at_80x24(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_rows(pilot, 4)
        help_screen = await open_help(pilot)
        entries = [line.strip() for line in help_screen.query_one("#help-text", Static).content.plain.splitlines()]
        assert len(entries) > 24  # more than the terminal holds: the rest is reached by scrolling
        seen: set[str] = set()
        for _ in range(len(entries)):
            await pilot.pause()
            seen.update(part.strip() for line in screen_lines(app) for part in line.split("█"))
            await pilot.press("down")
        assert [entry for entry in entries if entry not in seen] == []
        assert entries[-1].endswith("Close help")


async def test_help_opens_over_the_full_log_too(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await pilot.press("l")
        await wait_until(pilot, lambda: isinstance(app.screen, LogScreen), what="the log screen")
        await open_help(pilot)
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, LogScreen), what="back on the log")


async def test_enter_on_a_row_opens_its_full_log(app):
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, LogScreen), what="the log screen")
        assert app.screen.run.run_id == table.selected_run_id
