"""The dashboard's runs table on the real data path (LiveSource on `local`) shows the exact tok/s of a run's
metrics.jsonl, not the rounded figure of its step line."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.inventory.model import load_inventory
from orchestrator.watch.source import LiveSource
from tests.lab.workloads import run_cli
from tests.orchestrator.cli.exact_run import launch_exact_run
from tui.app import DashboardApp

from .conftest import cell, wait_until

pytestmark = pytest.mark.asyncio


async def test_the_runs_table_shows_350_tok_per_s_for_a_run_whose_metrics_say_350(inv, capsys):
    run = launch_exact_run(inv, capsys)
    inventory = load_inventory(Path(inv))
    try:
        with LiveSource(inventory, [inventory.target("local")], heartbeat_s=1.0) as source:
            app = DashboardApp(source, refresh_s=0.1)
            async with app.run_test(size=(160, 40)) as pilot:
                table = app.query_one("RunsTable")
                await wait_until(pilot, lambda: table.row_count == 1 and cell(table, run["run_id"], "step") == "7",
                                 timeout=20, what="the run's step 7")
                await wait_until(pilot, lambda: cell(table, run["run_id"], "tok_s") == "350", timeout=20,
                                 what="350 tok/s")
    finally:
        run_cli(str(inv), "kill", run["run_id"], "--grace", "1", capsys=capsys)
