"""Which run the dashboard opens on, that it stays there, and how runs of the same name are told apart."""
from __future__ import annotations

import dataclasses

import pytest

from tui.app import DashboardApp

from . import scenario
from .conftest import cell, select_run, wait_for_rows, wait_until
from .fake_source import FakeSource

pytestmark = pytest.mark.asyncio

LAUNCHED = {"r-0001": "2026-12-01T10:00:00Z", "r-0002": "2026-12-01T11:00:00Z", "r-0003": "2026-12-01T11:30:00Z",
            "r-0004": "2026-12-01T11:50:00Z"}


def dated_snapshot(**states: str):
    """The scenario with launch times (r-0004 the newest), and some states changed."""
    runs = tuple(dataclasses.replace(run, created_at=LAUNCHED[run.run_id], state=states.get(run.run_id, run.state))
                 for run in scenario.runs())
    return dataclasses.replace(scenario.snapshot(), runs=runs)


async def test_opens_on_the_newest_live_run_not_the_oldest() -> None:
    app = DashboardApp(FakeSource(dated_snapshot()), refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        # r-0004 is newer but failed; r-0003 is the newest still running
        await wait_until(pilot, lambda: table.selected_run_id == "r-0003", what="r-0003 selected")
        assert "seed-rerun" in str(app.query_one("#log-tail").border_title)


async def test_opens_on_the_newest_run_when_none_is_live() -> None:
    ended = {run_id: "succeeded" for run_id in ("r-0001", "r-0002", "r-0003")}
    app = DashboardApp(FakeSource(dated_snapshot(**ended)), refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await wait_until(pilot, lambda: table.selected_run_id == "r-0004", what="r-0004 selected")


async def test_the_selection_stays_on_its_run_across_refreshes() -> None:
    source = FakeSource(dated_snapshot())
    app = DashboardApp(source, refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0001")
        newer = dataclasses.replace(scenario.training_run(), run_id="r-0005", name="newest",
                                    created_at="2026-12-01T11:59:00Z")
        source.mutate(lambda snap: dataclasses.replace(snap, runs=(*snap.runs, newer)))
        await wait_for_rows(pilot, 5)
        source.update_run("r-0003", last_step=9)
        await wait_until(pilot, lambda: cell(table, "r-0003", "step") == "9", what="step 9")
        assert table.selected_run_id == "r-0001"


async def test_runs_of_the_same_name_show_the_end_of_their_id() -> None:
    first = dataclasses.replace(scenario.training_run(), run_id="ticker-261201-120000-3f2a", name="ticker")
    second = dataclasses.replace(first, run_id="ticker-261201-120500-9b1c", state="failed")
    snapshot = scenario.snapshot()
    source = FakeSource(dataclasses.replace(snapshot, runs=(*snapshot.runs, first, second)))
    app = DashboardApp(source, refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 6)
        assert cell(table, first.run_id, "run") == "ticker·3f2a"
        assert cell(table, second.run_id, "run") == "ticker·9b1c"
        assert cell(table, "r-0001", "run") == "qwen3-8b-drafter"
        await pilot.press("slash", *"failed", "enter")  # the other ticker filtered out: still told apart
        await wait_for_rows(pilot, 2)
        assert cell(table, second.run_id, "run") == "ticker·9b1c"
