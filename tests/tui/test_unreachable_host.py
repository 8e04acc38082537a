"""The host line of the real dashboard over a live source whose only host refuses connections."""
from __future__ import annotations

import pytest

from orchestrator.inventory.model import load_inventory
from orchestrator.watch.source import LiveSource
from tests.orchestrator.watch.test_watch_unreachable import closed_port
from tui.app import DashboardApp
from tui.widgets.host_status import HostStatus

from .conftest import wait_until

pytestmark = pytest.mark.asyncio


async def test_the_host_line_names_a_refusing_host_once(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  dead:\n    address: 127.0.0.1\n    port: {closed_port()}\n")
    inventory = load_inventory(path)
    with LiveSource(inventory, inventory.targets(["dead"])) as source:
        app = DashboardApp(source, refresh_s=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            line = app.query_one(HostStatus)
            # the host shows as disconnected first and its reason a refresh later: wait for the reason
            await wait_until(pilot, lambda: "disconnected: " in line.render().plain, timeout=20, what="dead down")
            text = line.render().plain
            assert text.startswith("hosts ✗ dead disconnected: "), text
            assert "cannot connect to 127.0.0.1:" in text or "no answer from 127.0.0.1:" in text, text
            assert text.count("dead") == 1, text  # was "dead disconnected: dead: cannot connect ..."
