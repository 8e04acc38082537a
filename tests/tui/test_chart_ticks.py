"""The charts' step labels come out the same in every process: plotext keeps x ticks in a set's order, which
follows the string hash seed, and a narrow chart drops whichever label it draws last."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tui.widgets.metric_charts import LOSS, TAU

from . import scenario

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = range(14, 31)  # 18 columns is where the dashboard's 120x40 layout showed a different label per seed
RENDER = """
import sys
from textual_plotext.plotext._figure import _figure_class as Figure
from tests.tui import scenario
from tui.widgets.metric_charts import LOSS, TAU, draw_chart
for series in (LOSS, TAU):
    for width in range(int(sys.argv[1]), int(sys.argv[2])):
        plt = Figure()
        draw_chart(plt, "chart", scenario.training_run().history, series)
        plt.plotsize(width, 11)
        plt.theme("clear")
        print(f"--- {len(series)} series, {width} columns")
        print(plt.build())
"""


def render(hash_seed: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RENDER, str(WIDTHS.start), str(WIDTHS.stop)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def step_labels(chart: str) -> list[str]:
    """The words of a chart's last line: its x axis labels."""
    return chart.rstrip().splitlines()[-1].replace("\x1b[0m", "").split()


def test_step_labels_do_not_depend_on_the_string_hash_seed():
    renders = {seed: render(seed) for seed in (0, 1, 2, 3)}
    assert renders[0].count("--- ") == 2 * len(WIDTHS)
    for seed in (1, 2, 3):
        assert renders[seed] == renders[0], f"the charts differ between PYTHONHASHSEED=0 and {seed}"


def test_crowded_step_labels_keep_the_first_and_latest_step_in_order():
    history = scenario.training_run().history
    first, latest = str(history[0].step), str(history[-1].step)
    charts = render(1).split("--- ")[1:]
    assert len(charts) == 2 * len(WIDTHS) and len(LOSS) != len(TAU)
    for chart in charts:
        labels = step_labels(chart)
        assert labels[0] == first and labels[-1] == latest, chart
        assert [int(label) for label in labels] == sorted(int(label) for label in labels), chart
