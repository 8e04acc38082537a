"""The τ chart: the held-out DDTree τ (largest node budget the run reports) beside the chain's figures."""
from __future__ import annotations

import dataclasses

import pytest
from textual_plotext import PlotextPlot

from . import scenario
from .conftest import select_run, wait_for_rows, wait_until

pytestmark = pytest.mark.asyncio


def with_trees(history):
    """Tree τ at 8 and 64 nodes wherever the held-out split was replayed."""
    return tuple(dataclasses.replace(point, tau_tree_heldout=((8, point.tau_heldout + 0.3),
                                                              (64, point.tau_heldout + 0.8)))
                 if point.tau_heldout is not None else point for point in history)


async def test_the_tau_chart_shows_the_tree_series_once_the_run_reports_one(app, source):
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_rows(pilot, 4)
        await select_run(pilot, "r-0001")
        figure = app.query_one("#chart-tau", PlotextPlot).plt
        await wait_until(pilot, lambda: figure.monitor.title == "τ train·held", what="the τ chart")
        assert len(figure.monitor.y) == 3  # train, held-out, decoded: no tree yet
        history = with_trees(scenario.training_run().history)
        source.update_run("r-0001", history=history)
        await wait_until(pilot, lambda: figure.monitor.title == "τ train·held·tree 64", what="the tree series")
        expected = [dict(point.tau_tree_heldout)[64] for point in history if point.tau_tree_heldout]
        assert len(expected) == 12 and list(figure.monitor.y[-1]) == expected
        assert figure.monitor.color[-1] == ["cyan"] * len(expected)
