"""`k` kill and `c` cleanup: confirmation modals, the calls they make, and what the table shows after."""
from __future__ import annotations

import pytest
from textual.content import Content
from textual.widgets import Button, Label, Static

from dflash_records.plans import CleanupAnswer, Finding, ForeignZombies
from orchestrator.watch.model import ActionResult

from tui.screens.cleanup_confirm import CleanupConfirmScreen
from tui.screens.kill_confirm import KillConfirmScreen
from tui.screens.main_screen import MainScreen

from . import scenario
from .conftest import cell, select_run, wait_for_rows, wait_for_screen, wait_until
from .fake_source import FakeSource

pytestmark = pytest.mark.asyncio


async def open_kill_prompt(pilot, run_id: str) -> KillConfirmScreen:
    await wait_for_rows(pilot, 4)
    await select_run(pilot, run_id)
    await pilot.press("k")
    return await wait_for_screen(pilot, KillConfirmScreen, ready="#question", what="the kill prompt")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_kill_prompt_shows_the_run_as_it_is_now(app, source, size):
    async with app.run_test(size=size) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0001")
        details = prompt.query_one("#details-text", Static)
        assert ", step 1200," in details.content.plain
        pid = source.run("r-0001").pid
        assert pid is not None and f", workload pid {pid}" in details.content.plain  # not the supervisor's
        assert "supervisor" not in details.content.plain
        source.update_run("r-0001", last_step=1250)
        await wait_until(pilot, lambda: ", step 1250," in details.content.plain, what="the newer step")
        await pilot.press("n")


@pytest.mark.parametrize("confirm_key", ["y", "enter"])
async def test_kill_confirmed_kills_the_run_and_the_row_turns_killed(app, source, confirm_key):
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0001")
        question = prompt.query_one("#question", Label).content
        assert str(question) == "Kill run qwen3-8b-drafter (r-0001) on pve1/200? TERM now, KILL after 30 s"
        assert source.kill_calls == []
        await pilot.press(confirm_key)
        table = app.query_one("RunsTable")
        await wait_until(pilot, lambda: cell(table, "r-0001", "state") == "killed", what="state killed")
        assert source.kill_calls == [("r-0001", 30.0)]
        assert isinstance(app.screen, MainScreen)
        assert cell(table, "r-0003", "state") == "running"


@pytest.mark.parametrize("cancel_key", ["n", "escape"])
async def test_kill_cancelled_calls_nothing(app, source, cancel_key):
    async with app.run_test(size=(120, 40)) as pilot:
        await open_kill_prompt(pilot, "r-0003")
        await pilot.press(cancel_key)
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the prompt closed")
        await pilot.pause(0.2)
        assert source.kill_calls == []
        assert cell(app.query_one("RunsTable"), "r-0003", "state") == "running"


async def test_kill_waits_the_grace_the_run_recorded_and_the_prompt_says_so(app, source):
    source.update_run("r-0003", grace_s=5.0)
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0003")
        assert str(prompt.query_one("#question", Label).content).endswith("TERM now, KILL after 5 s")
        await pilot.press("y")
        await wait_until(pilot, lambda: source.kill_calls == [("r-0003", 5.0)], what="kill called")


async def test_kill_grace_given_to_the_app_overrides_the_runs(source):
    from tui.app import DashboardApp

    source.update_run("r-0003", grace_s=5.0)
    app = DashboardApp(source, refresh_s=0.02, kill_grace_s=2.5)
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0003")
        assert str(prompt.query_one("#question", Label).content).endswith("TERM now, KILL after 2.5 s")
        await pilot.press("y")
        await wait_until(pilot, lambda: source.kill_calls == [("r-0003", 2.5)], what="kill called")


async def test_kill_of_an_ended_run_asks_nothing(app, source):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0004")
        await pilot.press("k")
        await pilot.pause(0.2)
        assert isinstance(app.screen, MainScreen)
        assert source.kill_calls == []


async def test_cleanup_shows_the_dry_run_then_runs_it_on_confirm(app, source):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0003")
        await pilot.press("c")
        await wait_for_screen(pilot, CleanupConfirmScreen, ready="#details-text", what="the cleanup plan")
        assert source.cleanup_calls == [("pve2/300", True)]
        plan = app.screen.query_one("#details-text", Static).content.plain
        assert "end stuck parent 4242 (python train.py)" in plan and "2 zombie child(ren) it never reaps" in plan
        assert "3 zombie(s) of PID 1: only a container restart clears them" in plan
        await pilot.press("y")
        await wait_until(pilot, lambda: len(source.cleanup_calls) == 2, what="the real cleanup")
        assert source.cleanup_calls == [("pve2/300", True), ("pve2/300", False)]
        assert isinstance(app.screen, MainScreen)


async def test_cleanup_cancelled_after_the_dry_run_changes_nothing(app, source):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await pilot.press("c")
        await wait_for_screen(pilot, CleanupConfirmScreen, ready="#details-text", what="the cleanup plan")
        await pilot.press("n")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the prompt closed")
        await pilot.pause(0.2)
        assert source.cleanup_calls == [("pve1/200", True)]


async def test_cleanup_with_nothing_planned_says_so_and_offers_no_confirm():
    from tui.app import DashboardApp

    finding = Finding(kind="zombies_of_init", advice="only a container restart clears them",
                      description="3 zombie(s) of PID 1: only a container restart clears them")
    nothing = ActionResult(ok=True, message="pve2/300: nothing to clean",
                           cleanup=CleanupAnswer(ok=True, dry_run=True, findings=(finding,)))
    app = DashboardApp(FakeSource(scenario.snapshot(), cleanup_plan=nothing), refresh_s=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0003")
        await pilot.press("c")
        await wait_for_screen(pilot, CleanupConfirmScreen, ready="#details-text", what="the cleanup plan")
        dialog = app.screen
        assert str(dialog.query_one("#question", Label).content) == "Nothing to clean on pve2/300."
        assert [button.id for button in dialog.query(Button)] == ["no"]
        assert str(dialog.query_one("#no", Button).label) == "Close (n)"
        plan = dialog.query_one("#details-text", Static).content.plain
        # said once, by the title: not again by the message nor by the plan's text
        assert "nothing to clean" not in plan.lower() and "Planned actions" not in plan
        assert plan.startswith("No orphan of an ended run (stuck or not), no dead run.")
        assert "3 zombie(s) of PID 1: only a container restart clears them" in plan  # what it cannot fix: still said
        await pilot.press("y")  # nothing to confirm: y only closes
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the dialog closed")
        await pilot.pause(0.2)
        assert app.source.cleanup_calls == [("pve2/300", True)]


async def test_the_cleanup_plan_gives_its_advice_on_foreign_zombies_once():
    from dflash_agent.cleanup import ADVICE_FOREIGN
    from tui.app import DashboardApp

    foreign = [ForeignZombies.from_dict({
        "parent": {"pid": pid, "cmdline": "sleep 301"}, "count": 1, "pids": [pid + 1], "advice": ADVICE_FOREIGN,
        "description": f"1 zombie(s) of pid {pid} (sleep 301), which no dflashctl run owns: left alone"})
        for pid in (700, 800, 900)]
    plan = ActionResult(ok=True, message="pve2/300: nothing to clean",
                        cleanup=CleanupAnswer(ok=True, dry_run=True, foreign_zombies=tuple(foreign)))
    app = DashboardApp(FakeSource(scenario.snapshot(), cleanup_plan=plan), refresh_s=0.02)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0003")
        await pilot.press("c")
        dialog = await wait_for_screen(pilot, CleanupConfirmScreen, ready="#details-text", what="the cleanup plan")
        text = dialog.query_one("#details-text", Static).content.plain
        assert all(entry.description in text for entry in foreign), text
        assert text.count(ADVICE_FOREIGN) == 1, text


async def test_hostile_run_name_is_shown_literally(app, source):
    hostile = "[bold]x[/bold] $(touch /tmp/pwned) '; rm -rf /tmp/x; '"
    source.update_run("r-0001", name=hostile)
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0001")
        assert str(prompt.query_one("#question", Label).content).startswith(f"Kill run {hostile[:24]}")
        await pilot.press("n")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the prompt closed")
        shown = cell(app.query_one("RunsTable"), "r-0001", "run")  # cut to what fits beside every column
        assert shown.endswith("…") and hostile.startswith(shown[:-1]) and len(shown) >= 17, shown
        title = Content.from_markup(app.query_one("#log-tail").border_title).plain
        assert f"log tail · {hostile} (r-0001)" == title
        assert source.kill_calls == []


async def test_enter_on_the_focused_cancel_button_cancels(app, source):
    async with app.run_test(size=(120, 40)) as pilot:
        prompt = await open_kill_prompt(pilot, "r-0001")
        prompt.query_one("#no").focus()
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="the prompt closed")
        await pilot.pause(0.2)
        assert source.kill_calls == []
