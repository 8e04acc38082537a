"""80x24: the compact layout keeps what matters on screen; the full one comes back on a larger terminal."""
from __future__ import annotations

import pytest
from textual.widgets import Footer

from tui.widgets.runs_table import RunsTable

from .conftest import cell, select_run, wait_for_rows, wait_until

pytestmark = pytest.mark.asyncio

NARROW_COLUMNS = ["target", "run", "state", "step", "loss", "tok_s", "eta", "exceptions"]


def column_keys(table: RunsTable) -> list[str]:
    return [column.key.value for column in table.columns.values()]


def shown_charts(app) -> list[str]:
    return [plot.id for plot in app.query("#charts > PlotextPlot") if plot.display]


@pytest.mark.parametrize("width, height, narrow", [(80, 24, True), (100, 24, True), (100, 40, True),
                                                   (120, 24, False), (120, 40, False)])
async def test_the_table_keeps_its_key_columns_without_scrolling_sideways(app, width, height, narrow):
    async with app.run_test(size=(width, height)) as pilot:
        table = await wait_for_rows(pilot, 4)
        # all 12 columns need about 116 cells here
        await wait_until(pilot, lambda: (column_keys(table) == NARROW_COLUMNS) == narrow, what="the columns")
        assert set(NARROW_COLUMNS) <= set(column_keys(table))
        await wait_until(pilot, lambda: table.max_scroll_x == 0 and table.virtual_size.width > 0,
                         what=f"no sideways scrolling ({table.virtual_size}, {table.size})")
        assert table.region.right <= width
        assert cell(table, "r-0003", "tok_s") == "11.7K" and cell(table, "r-0003", "eta") == "11.9d"
        assert cell(table, "r-0004", "exceptions") == "1"


async def test_80x24_shows_one_chart_that_m_switches_and_a_gpu_line(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0001")
        assert shown_charts(app) == ["chart-loss"]
        charts = app.query_one("#charts")
        assert charts.region.height >= 8 and charts.region.bottom <= 23
        assert str(charts.border_title).startswith("loss · qwen3-8b-drafter")
        assert charts.border_subtitle == "m: tok/s"
        await pilot.press("m")
        await wait_until(pilot, lambda: shown_charts(app) == ["chart-toks"], what="the tok/s chart")
        assert str(charts.border_title).startswith("tok/s · qwen3-8b-drafter")
        assert charts.border_subtitle == "m: τ"
        await pilot.press("m")
        await wait_until(pilot, lambda: shown_charts(app) == ["chart-tau"], what="the τ chart")
        assert str(charts.border_title).startswith("τ · qwen3-8b-drafter")
        assert charts.border_subtitle == "m: loss"
        await pilot.press("m")
        await wait_until(pilot, lambda: shown_charts(app) == ["chart-loss"], what="the loss chart again")
        line = app.query_one("#gpu-line")
        assert line.display and line.region.height == 1
        assert line.render().plain == "GPUs pve1/200 · 0: 97% 68/96G  1: 96% 69/96G"


async def test_the_layout_follows_the_terminal_size(app):
    full_charts = ["chart-loss", "chart-acc", "chart-toks", "chart-tau"]
    footer_keys = lambda: [key.key for key in app.query_one(Footer).query("FooterKey")]  # noqa: E731
    async with app.run_test(size=(80, 24)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0003")
        await pilot.resize_terminal(120, 40)
        await wait_until(pilot, lambda: len(column_keys(table)) == 12, what="every column")
        await wait_until(pilot, lambda: shown_charts(app) == full_charts, what="the four charts")
        await wait_until(pilot, lambda: app.query_one("#gpus").display and not app.query_one("#gpu-line").display,
                         what="the GPU panel instead of the line")
        # only one chart at a time needs switching
        await wait_until(pilot, lambda: "k" in footer_keys() and "m" not in footer_keys(), what="no m key")
        assert table.selected_run_id == "r-0003"  # the rebuilt table keeps its run
        await pilot.resize_terminal(80, 24)
        await wait_until(pilot, lambda: column_keys(table) == NARROW_COLUMNS, what="the narrow columns")
        await wait_until(pilot, lambda: shown_charts(app) == ["chart-loss"], what="one chart")
        await wait_until(pilot, lambda: "m" in footer_keys(), what="the m key")
        assert table.selected_run_id == "r-0003"


async def test_a_long_run_name_is_cut_before_any_column_is_dropped(app, source):
    source.update_run("r-0001", name="a-drafter-run-whose-name-goes-on-and-on")
    async with app.run_test(size=(120, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await wait_until(pilot, lambda: cell(table, "r-0001", "run").startswith("a-drafter"), what="the name")
        assert len(column_keys(table)) == 12
        await wait_until(pilot, lambda: table.max_scroll_x == 0 and table.virtual_size.width > 0,
                         what="no sideways scrolling")
        shown = cell(table, "r-0001", "run")
        assert shown.endswith("…") and 17 <= len(shown) < 24, shown


async def test_the_tau_column_shows_where_a_run_has_one_and_there_is_room(app, source):
    async with app.run_test(size=(140, 40)) as pilot:
        table = await wait_for_rows(pilot, 4)
        await wait_until(pilot, lambda: "tau" in column_keys(table), what="the τ column")
        # the τ decoded on held-out prompts where the run measures it (1 + 0.95 (1 - e^-4) at step 1200), a dash
        # where a run has none
        assert cell(table, "r-0001", "tau") == "1.93" and cell(table, "r-0003", "tau") == "-"
        await pilot.resize_terminal(120, 40)  # no room: τ goes first, every other column stays
        await wait_until(pilot, lambda: len(column_keys(table)) == 12 and "tau" not in column_keys(table),
                         what="the columns without τ")
