"""Screenshots with fixed data: 120x40 (the full layout) and 80x24 (the compact one: state, step, loss, tok/s,
ETA and exceptions of every run, one chart, a GPU line), plus the help screen."""
from __future__ import annotations

from tui.app import DashboardApp

from . import scenario
from .conftest import select_run, wait_for_rows, wait_until
from .fake_source import FakeSource


def settled_on(run_id: str, *keys: str):
    async def run_before(pilot) -> None:
        await wait_for_rows(pilot, len(scenario.runs()))
        await select_run(pilot, run_id)
        await pilot.press(*keys)
        await pilot.pause(0.1)

    return run_before


def dashboard() -> DashboardApp:
    return DashboardApp(FakeSource(scenario.snapshot()), refresh_s=0.02)


def test_main_screen_120x40(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(120, 40), run_before=settled_on("r-0001"))


def test_main_screen_120x40_stalled_run(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(120, 40), run_before=settled_on("r-0003"))


def test_main_screen_80x24(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(80, 24), run_before=settled_on("r-0004"))


def test_main_screen_80x24_throughput_chart(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(80, 24), run_before=settled_on("r-0001", "m"))


def test_main_screen_80x24_stalled_run_gpu_line(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(80, 24), run_before=settled_on("r-0003"))


def test_help_screen_80x24(snap_compare):
    async def open_help(pilot) -> None:
        await wait_for_rows(pilot, len(scenario.runs()))
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == "HelpScreen", what="the help")
        await pilot.pause(0.1)

    assert snap_compare(dashboard(), terminal_size=(80, 24), run_before=open_help)


def test_main_screen_80x24_tau_chart(snap_compare):
    """The τ chart of the compact layout: replayed τ on training batches (magenta) against held-out (green)."""
    assert snap_compare(dashboard(), terminal_size=(80, 24), run_before=settled_on("r-0001", "m", "m"))
