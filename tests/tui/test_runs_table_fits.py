"""The runs table never draws a value cut short and never puts a column past the screen's edge: in every frame it
draws, at 80 to 120 columns and 24 or 40 rows, for runs fed the trainer's own lines (launched, in start-up, at
their first step, long into training with wide values) and across resizes."""
from __future__ import annotations

import dataclasses

import pytest
from textual.strip import Strip

from dflash_records.run import RunRecord
from orchestrator.watch.model import HostView, RunView, Snapshot
from orchestrator.watch.trackers import RunTracker
from dflash_records.step import StepRecord, format_step_line
from trainer.logformat import format_startup_line
from tests.seed_logs import SEED_STARTUP
from tui.app import DashboardApp
from tui.runcells import run_cells
from tui.widgets.runs_table import RunsTable

from .conftest import wait_for_rows, wait_until
from .fake_source import FakeSource

pytestmark = pytest.mark.asyncio

SIZES = ((80, 24), (90, 40), (100, 24), (120, 40), (80, 40), (120, 24), (90, 24), (100, 40))
STARTUP = "".join(format_startup_line(elapsed, stage) + "\n" for elapsed, stage in (
    (12.0, "loading target"), (30.5, "building drafter"),
    (41.2, "compiling 1/2 (flex_attention, full_attention layers)"), (80.0, "first step")))


def step_line(step: int, **values) -> str:
    """A step line as the trainer writes it, with wide values: lr 3.57e-05, 123.5K tok/s, an ETA of 1d02h (1.1d)."""
    metrics = StepRecord(elapsed_s=60.0 * step, step=step, loss=12.5546, acc=0.025, streak=0.0, lr=3.57e-05,
                          noise=0.0003, tgt_batches_per_s=0.34, dft_batches_per_s=0.29, tok_per_s=123_456.0,
                          q_pre=[50, 50], q_hs=[15], epoch=0.01, eta_s=93_720.0)
    return format_step_line(dataclasses.replace(metrics, **values)) + "\n"


LOG_AT = {
    "launched": "",
    "start-up": SEED_STARTUP + STARTUP,
    "first step": SEED_STARTUP + STARTUP + step_line(1),
    "training": SEED_STARTUP + STARTUP + "".join(step_line(step) for step in range(1, 2001, 250))
                + step_line(123_456, loss=10.1234, acc=0.512, streak=3.21, tau_replay=2.345),
}


def run_view(index: int, stage: str) -> RunView:
    """Run `tinyN` as the live source sees it: its record, and its train.log so far through the real parser."""
    record = {"run_id": f"tiny-2612{index:02d}-120000-3f2a", "name": f"tiny{index}", "gpus": [],
              "state": "starting" if stage == "launched" else "running",
              "created_at": f"2026-12-{index + 1:02d}T12:00:00Z"}
    tracker = RunTracker("local", RunRecord.from_dict(record), history=100, tail=20)
    if LOG_AT[stage]:
        tracker.feed(0, 1, LOG_AT[stage].encode(), now=0.0)
    return tracker.view()


def snapshot(*stages: str) -> Snapshot:
    return Snapshot(taken_at="2026-12-03T12:00:00Z", runs=tuple(run_view(i, stage) for i, stage in enumerate(stages)),
                    hosts=(HostView(name="local", connected=True),))


class Frames:
    """Checks every line the runs table draws, when it draws it: the header has every shown column's label, and
    a run's row every one of its cells, whole and in order (a line is what the table puts on screen: cut at its
    width, so a column past the edge is missing from it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.drawn = 0
        self.at = "start"
        self.cut: list[str] = []
        draw = RunsTable.render_line

        def render_line(table: RunsTable, y: int) -> Strip:
            strip = draw(table, y)
            self._check(table, y, strip.text)
            return strip

        monkeypatch.setattr(RunsTable, "render_line", render_line)

    def _check(self, table: RunsTable, y: int, line: str) -> None:
        if y == 0:
            expected = [column.label.plain for column in table.ordered_columns]
        else:  # the header stays on top; rows are one line each, scrolled by scroll_y
            row = y - 1 + table.scroll_offset.y
            if not table.is_valid_row_index(row):
                return  # a blank line below the rows
            expected = [cell.plain for cell in table.get_row_at(row)]
        self.drawn += 1
        at = 0
        for text in expected:
            found = line.find(text, at)
            if found < 0:
                self.cut.append(f"{self.at}: {table.size.width} cells: {text!r} is not whole in {line.rstrip()!r}")
                return
            at = found + len(text)


async def settle(pilot, app: DashboardApp, width: int, rows: int) -> RunsTable:
    table = app.query_one(RunsTable)
    await wait_until(pilot, lambda: table.row_count == rows and table.virtual_size.width, what=f"{rows} rows")
    await pilot.pause()
    # nothing past the screen's right edge, nothing to scroll sideways to
    await wait_until(pilot, lambda: table.max_scroll_x == 0, what=f"no sideways scrolling ({table.virtual_size})")
    assert table.region.right <= width
    return table


# what the runs go through, one snapshot after another: the first run alone, launched with no line yet, in start-up,
# at its first step; then a second one launched beside it; then long into training with a second in start-up
STAGES = (("launched",), ("start-up",), ("first step",), ("first step", "launched"), ("training", "start-up"),
          ("training", "training"))


async def test_every_frame_shows_whole_cells_from_launch_to_training_and_across_resizes(monkeypatch):
    start = SIZES[0]  # 80x24: where a full table was drawn with lr cut by the edge and tok/s and ETA past it
    frames = Frames(monkeypatch)
    source = FakeSource(snapshot(*STAGES[0]))
    app = DashboardApp(source, refresh_s=0.02)

    async def show(stages: tuple[str, ...], size: tuple[int, int]) -> None:
        frames.at = f"{stages} at {size}"
        shown = snapshot(*stages)
        source.mutate(lambda _: shown)
        table = await settle(pilot, app, size[0], len(stages))
        first, step = shown.runs[0].run_id, run_cells(shown.runs[0])["step"].plain
        await wait_until(pilot, lambda: table.get_cell(first, "step").plain == step, what=f"the rows of {stages}")
        await pilot.pause()
        assert "tok_s" in table.columns and "eta" in table.columns

    async with app.run_test(size=start) as pilot:
        await wait_for_rows(pilot, 1)
        for stages in STAGES[1:]:
            await show(stages, start)
        # every size, from the one before: the table is drawn at it before the runs change, then they change
        for index, size in enumerate(SIZES[1:] + SIZES[:1]):
            frames.at = f"resized to {size}"
            await pilot.resize_terminal(*size)
            await settle(pilot, app, size[0], len(app.main_screen.snapshot.runs))
            await show(STAGES[index % len(STAGES)], size)
    assert frames.drawn > 0
    assert not frames.cut, "\n".join(frames.cut[:12])


async def test_a_row_drawn_before_the_table_is_idle_is_drawn_whole(monkeypatch):
    """A screen refresh can come between a row's new values and the table's next idle moment (a loaded machine, a
    busy event loop): the row drawn then must already have the widths of its new values."""
    frames = Frames(monkeypatch)
    source = FakeSource(snapshot("launched"))
    app = DashboardApp(source, refresh_s=3600)  # the test feeds the table itself: no snapshot in between
    async with app.run_test(size=(120, 24)) as pilot:
        table = await settle(pilot, app, 120, 1)
        for stages in (("launched", "launched"), ("training", "launched"), ("training", "training")):
            table.show_runs(snapshot(*stages).runs)
            for y in range(table.size.height):  # the refresh that came first
                table.render_line(y)
            await pilot.pause()
            await settle(pilot, app, 120, len(stages))
            for y in range(table.size.height):
                table.render_line(y)
    assert frames.drawn > 0
    assert not frames.cut, "\n".join(frames.cut[:12])
