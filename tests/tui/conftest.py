"""Fixtures for driving the real dashboard app against a FakeSource."""
from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from tests.lab.workloads import stop_keeper, write_local_inventory
from tui.app import DashboardApp
from tui.widgets.runs_table import RunsTable

from . import scenario
from .fake_source import FakeSource

TIMEOUT_S = 5.0


@pytest.fixture
def source() -> FakeSource:
    return FakeSource(scenario.snapshot())


@pytest.fixture
def app(source: FakeSource) -> DashboardApp:
    return DashboardApp(source, refresh_s=0.02)


async def wait_until(pilot: Pilot, condition: Callable[[], object], *, timeout: float = TIMEOUT_S,
                     what: str = "condition") -> None:
    """Let the app run until `condition()` is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)


async def wait_for_screen(pilot: Pilot, screen_type: type, *, ready: str, timeout: float = TIMEOUT_S,
                          what: str = "the screen"):
    """The pushed screen once it is on top AND composed: a screen is on the stack before its widgets exist, so a
    query right after `isinstance(app.screen, ...)` can find nothing on a loaded machine. `ready`: a selector
    that matches once it is composed."""
    def composed() -> bool:
        screen = pilot.app.screen
        return isinstance(screen, screen_type) and bool(screen.query(ready))

    await wait_until(pilot, composed, timeout=timeout, what=what)
    return pilot.app.screen


async def wait_for_rows(pilot: Pilot, count: int) -> RunsTable:
    table = pilot.app.query_one(RunsTable)
    await wait_until(pilot, lambda: table.row_count == count, what=f"{count} rows")
    return table


def screen_lines(app: App) -> list[str]:
    """What a person sees on the terminal now, as plain text lines (the screens below a dialog included)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text().splitlines()


def cell(table: RunsTable, run_id: str, column: str) -> str:
    return table.get_cell(run_id, column).plain


async def select_run(pilot: Pilot, run_id: str) -> None:
    table = pilot.app.query_one(RunsTable)
    table.move_cursor(row=table.get_row_index(run_id), animate=False)
    await wait_until(pilot, lambda: table.selected_run_id == run_id, what=f"{run_id} selected")
    await pilot.pause()


@pytest.fixture
def inv(tmp_path: Path):
    """An inventory of `local` working under tmp_path, for the dashboard on the real data path (LiveSource); the
    keeper its launches started is stopped afterwards."""
    yield write_local_inventory(tmp_path / "inventory.yaml", tmp_path / "work")
    stop_keeper(tmp_path / "work" / ".dflash" / "runs")
