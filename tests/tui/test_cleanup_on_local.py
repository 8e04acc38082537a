"""The dashboard's `c` on the real data path (LiveSource on `local`): a process no run owns, holding zombies,
is shown as left alone and never offered for ending."""
from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Button, Label, Static

from orchestrator.inventory.model import load_inventory
from orchestrator.watch.source import LiveSource
from tests.lab.workloads import run_cli, start_foreign_stuck_parent
from tui.app import DashboardApp
from tui.screens.cleanup_confirm import CleanupConfirmScreen
from tui.screens.main_screen import MainScreen

from .conftest import select_run, wait_for_screen, wait_until

pytestmark = pytest.mark.asyncio


async def test_the_cleanup_dialog_never_offers_to_end_a_process_no_run_owns(inv, capsys):
    code, run, err = run_cli(str(inv), "launch", "local", "--json", "--name", "beside", "--", "sleep", "60",
                             capsys=capsys)
    assert code == 0, err
    foreign = start_foreign_stuck_parent()
    inventory = load_inventory(Path(inv))
    try:
        with LiveSource(inventory, [inventory.target("local")], heartbeat_s=1.0) as source:
            app = DashboardApp(source, refresh_s=0.1)
            async with app.run_test(size=(120, 40)) as pilot:
                table = app.query_one("RunsTable")
                await wait_until(pilot, lambda: table.row_count == 1, timeout=20, what="the run's row")
                await select_run(pilot, run["run_id"])
                await pilot.press("c")
                dialog = await wait_for_screen(pilot, CleanupConfirmScreen, ready="#details-text", timeout=30,
                                               what="the cleanup plan")
                plan = dialog.query_one("#details-text", Static).content.plain
                assert [button.id for button in dialog.query(Button)] == ["no"], plan
                assert str(dialog.query_one("#question", Label).content) == "Nothing to clean on local."
                assert "Not ours, left alone" in plan
                assert f"of pid {foreign.pid} (sleep 301), which no dflashctl run owns: left alone" in plan
                await pilot.press("n")
                await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the dialog closed")
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()
        run_cli(str(inv), "kill", run["run_id"], "--grace", "1", capsys=capsys)
