"""Screenshots of the main screen with fixed data, pinned at 120x40 (every panel) and 80x24 (collapsed)."""
from __future__ import annotations

from tui.app import DashboardApp

from . import scenario
from .conftest import select_run, wait_for_rows
from .fake_source import FakeSource


def settled_on(run_id: str):
    async def run_before(pilot) -> None:
        await wait_for_rows(pilot, len(scenario.runs()))
        await select_run(pilot, run_id)
        await pilot.pause(0.1)

    return run_before


def test_main_screen_120x40(snap_compare):
    app = DashboardApp(FakeSource(scenario.snapshot()), refresh_s=0.02)
    assert snap_compare(app, terminal_size=(120, 40), run_before=settled_on("r-0001"))


def test_main_screen_120x40_stalled_run(snap_compare):
    app = DashboardApp(FakeSource(scenario.snapshot()), refresh_s=0.02)
    assert snap_compare(app, terminal_size=(120, 40), run_before=settled_on("r-0003"))


def test_main_screen_80x24(snap_compare):
    app = DashboardApp(FakeSource(scenario.snapshot()), refresh_s=0.02)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settled_on("r-0004"))
