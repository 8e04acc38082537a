"""The real dashboard on the real data path: Pilot drives DashboardApp over a LiveSource watching the lab."""
from __future__ import annotations

import sys
import time

import pytest

from orchestrator.runs.client import RunClient
from orchestrator.runs.spec import LaunchSpec
from orchestrator.transports.pool import Connections
from orchestrator.watch.source import LiveSource
from tests.lab.workloads import QUIET, STEP, counter, log_path, quick_inventory
from tests.lab.workloads import TRACEBACK as TRACEBACK_TEMPLATE
from tui.app import DashboardApp
from tui.screens.kill_confirm import KillConfirmScreen
from tui.widgets.host_status import HostStatus
from tui.widgets.runs_table import RunsTable

from tests.tui.conftest import cell, select_run, wait_for_screen, wait_until

pytestmark = [pytest.mark.lab, pytest.mark.asyncio]

COUNTER = counter(0.2)
TRACEBACK = TRACEBACK_TEMPLATE.format(message="NCCL watchdog timed out")


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory):
    return quick_inventory(lab, tmp_path_factory.mktemp("inv") / "inventory.yaml")


@pytest.fixture()
def runs(inventory):
    with Connections() as conns:
        client = RunClient(inventory, conns)
        quiet = client.launch(LaunchSpec(inventory.target("pve1/200"), [sys.executable, "-c", QUIET], "tuiquiet"))
        counter = client.launch(LaunchSpec(inventory.target("pve2/300"), [sys.executable, "-c", COUNTER],
                                           "tuicounter", grace=1.5))
        yield quiet.run_id, counter.run_id
        client.kill(inventory.target("pve1/200"), [quiet.run_id], grace=1)
        client.kill(inventory.target("pve2/300"), [counter.run_id], grace=1)


def step_of(table: RunsTable, run_id: str) -> int:
    text = cell(table, run_id, "step")
    return int(text) if text.isdigit() else -1


async def test_dashboard_on_two_lab_hosts(lab, inventory, runs) -> None:
    quiet, counter = runs
    targets = [inventory.target("pve1/200"), inventory.target("pve2/300")]
    with LiveSource(inventory, targets, heartbeat_s=1.0) as source:
        app = DashboardApp(source, refresh_s=0.1)  # kills wait the grace each run was launched with
        async with app.run_test(size=(120, 40)) as pilot:
            table = app.query_one(RunsTable)
            keys = lambda: {str(k.value) for k in table.rows}  # noqa: E731
            await wait_until(pilot, lambda: {quiet, counter} <= keys(), timeout=30, what="rows of both hosts")

            # steps update in place
            first = step_of(table, counter)
            await wait_until(pilot, lambda: step_of(table, counter) > first + 3, timeout=10, what="steps")

            # an injected traceback raises an alert
            with log_path(lab, inventory, "pve1", 200, quiet).open("a") as handle:
                handle.write(TRACEBACK)
            await wait_until(pilot, lambda: any(a.kind == "exception" and a.run_id == quiet
                                                for a in source.snapshot().alerts), timeout=10, what="the alert")
            alerts_text = lambda: str(app.query_one("#alerts").render())  # noqa: E731
            await wait_until(pilot, lambda: "NCCL watchdog" in alerts_text() or cell(table, quiet, "exceptions")
                             not in ("", "0", "-"), timeout=5, what="the alert on screen")

            # a host whose link goes down shows disconnected while the other keeps updating
            lab.link_down("pve2")
            try:
                hosts = app.query_one(HostStatus)
                await wait_until(pilot, lambda: any(h.name == "pve2" and not h.connected
                                                    for h in source.snapshot().hosts), timeout=15, what="pve2 down")
                await wait_until(pilot, lambda: "pve2" in str(hosts.render()) and "pve1" in str(hosts.render()),
                                 timeout=5, what="host line")
                with log_path(lab, inventory, "pve1", 200, quiet).open("a") as handle:
                    handle.write(STEP.format(i=4242) + "\n")
                await wait_until(pilot, lambda: step_of(table, quiet) == 4242, timeout=5, what="pve1 updating")
                stalled = step_of(table, counter)
                time.sleep(1.5)
            finally:
                lab.link_up("pve2")
            # back: its log resumes where it stopped, no line lost or repeated
            await wait_until(pilot, lambda: step_of(table, counter) > stalled + 10, timeout=30, what="resume")
            run = next(r for r in source.snapshot().runs if r.run_id == counter)
            steps = [p.step for p in run.history]
            assert steps == list(range(steps[0], steps[0] + len(steps)))

            # k + confirm kills the run and its row turns killed
            await select_run(pilot, counter)
            await pilot.press("k")
            await wait_for_screen(pilot, KillConfirmScreen, ready="#question", what="kill prompt")
            assert str(app.screen.query_one("#question").content).endswith("TERM now, KILL after 1.5 s")
            await pilot.press("y")
            await wait_until(pilot, lambda: cell(table, counter, "state") == "killed", timeout=20,
                             what="row killed")
    assert [p for p in lab.ct_processes("pve2", 300) if p.environ.get("DFLASH_RUN_ID") == counter] == []
