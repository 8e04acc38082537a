"""A multi-node job's row: the log tail names every node, the GPU panel shows the GPUs of all of them."""
from __future__ import annotations

import dataclasses

import pytest

from dflash_records.gpu import GpuRow
from orchestrator.watch.model import GpuView, NodeView
from tui.app import DashboardApp
from tui.widgets.gpu_panel import GpuPanel

from . import scenario
from .conftest import select_run, wait_for_rows, wait_until
from .fake_source import FakeSource

pytestmark = pytest.mark.asyncio


async def test_job_row_shows_its_nodes_and_their_gpus() -> None:
    base = scenario.snapshot()
    job = dataclasses.replace(
        scenario.training_run(), run_id="big-job", target="pve1/200+pve2/300",
        nodes=(NodeView("big-job-n0", "pve1/200", 0, "running", pid=11),
               NodeView("big-job-n1", "pve2/300", 1, "failed", signal=9)))
    gpus = tuple(GpuView(target, GpuRow(0, memory_used_mib=mib, memory_total_mib=143771.0, utilization_pct=pct))
                 for target, mib, pct in (("pve1/200", 1000.0, 50.0), ("pve2/300", 2000.0, 0.0),
                                          ("elsewhere/1", 3000.0, 0.0)))
    source = FakeSource(dataclasses.replace(base, runs=(job,), gpus=gpus))
    app = DashboardApp(source, refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 1)
        await select_run(pilot, "big-job")
        title = lambda: str(app.query_one("#log-tail").border_title)  # noqa: E731
        await wait_until(pilot, lambda: "n1 pve2/300 failed" in title(), what="the nodes in the title")
        assert "n0 pve1/200 running" in title()
        panel_title = str(app.query_one(GpuPanel).border_title)
        assert "pve1/200" in panel_title and "pve2/300" in panel_title and "elsewhere" not in panel_title
