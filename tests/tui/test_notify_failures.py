"""A notification that cannot be sent, seen on the real dashboard: the pump beside DashboardApp sends from its own
thread, and the failure shows in the alerts pane while the app keeps answering."""
from __future__ import annotations

import time

import pytest
from textual.widgets import Static

from orchestrator.inventory.model import builtin_inventory
from orchestrator.notify.destinations import destinations
from orchestrator.notify.pump import AlertPump
from orchestrator.watch.model import AlertView
from orchestrator.watch.source import LiveSource
from tui.app import DashboardApp

from .conftest import wait_until

pytest.importorskip("apprise")
pytestmark = pytest.mark.asyncio


async def test_a_failed_notification_shows_on_the_dashboard_and_holds_nothing_up() -> None:
    with LiveSource(builtin_inventory(), []) as source:
        pump = AlertPump(source, destinations(builtin_inventory(), ["json://127.0.0.1:1/hook"])).start()
        try:
            app = DashboardApp(source, refresh_s=0.05)
            async with app.run_test(size=(120, 40)) as pilot:
                source.note(AlertView(time="2026-12-02T06:00:00Z", run_id="r-0001", target="pve1/200", kind="nan",
                                      severity="error", message="loss is nan at step 7"))
                alerts = app.query_one("#alerts-text", Static)
                await wait_until(pilot, lambda: "not sent" in alerts.content.plain, timeout=10,
                                 what="the failed notification")
                lines = alerts.content.plain.splitlines()
                assert any("loss is nan at step 7" in line for line in lines)
                assert any("nan notification to json://127.0.0.1:1/hook not sent:" in line for line in lines), lines
                started = time.monotonic()
                await pilot.press("question_mark")  # the app still answers at once
                await pilot.pause(0.1)
                assert time.monotonic() - started < 2.0 and app.screen is not app.screen_stack[0]
        finally:
            pump.stop(flush_s=0.5)
