"""Loss, acc/streak, throughput and τ (train replay vs held-out, the held-out DDTree trees) of the selected run over
its steps (plotext)."""
from __future__ import annotations

import math
from collections.abc import Callable

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual_plotext import PlotextPlot

from orchestrator.watch.model import MetricPoint, RunView

# (label, field, colour, y axis side)
Series = tuple[str, Callable[[MetricPoint], float | None], str, str]

LOSS: tuple[Series, ...] = (("loss", lambda p: p.loss, "red", "left"),)
ACCURACY: tuple[Series, ...] = (
    ("acc", lambda p: p.acc, "green", "left"),
    ("streak", lambda p: p.streak, "cyan", "right"),
)
THROUGHPUT: tuple[Series, ...] = (("Ktok/s", lambda p: None if p.tok_per_s is None else p.tok_per_s / 1e3,
                                   "yellow", "left"),)
# τ from replayed decoding rounds: on training batches against the held-out split (the gap is overfitting),
# and measured by real speculative decoding of held-out prompts where the run does that (eval_prompts)
TAU: tuple[Series, ...] = (
    ("train", lambda p: p.tau_replay, "magenta", "left"),
    ("held-out", lambda p: p.tau_heldout, "green", "left"),
    ("decoded", lambda p: p.tau_eval, "yellow", "left"),
)
TREE_COLOUR = "cyan"


def tree_series(history: tuple[MetricPoint, ...]) -> tuple[Series, ...]:
    """DDTree τ replayed on the held-out split at the largest node budget the run reports (what the drafter's
    second choices add over its chain); none when the run reports no tree τ."""
    budgets = {budget for point in history for budget, _ in point.tau_tree_heldout}
    if not budgets:
        return ()
    largest = max(budgets)
    return ((f"tree {largest}", lambda p: dict(p.tau_tree_heldout).get(largest), TREE_COLOUR, "left"),)
# The charts a small terminal shows one at a time, in switching order: (plot id, what its title calls it).
SINGLE_CHARTS = (("chart-loss", "loss"), ("chart-toks", "tok/s"), ("chart-tau", "τ"))


class MetricCharts(Horizontal):
    """Four charts side by side; where the layout shows one (the compact one), `chosen` is that one."""

    DEFAULT_CSS = """
    MetricCharts { height: 12; }
    MetricCharts > PlotextPlot { width: 1fr; height: 1fr; }
    """

    chosen: reactive[str] = reactive(SINGLE_CHARTS[0][0])

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple | None = None

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="chart-loss")
        yield PlotextPlot(id="chart-acc")
        yield PlotextPlot(id="chart-toks")
        yield PlotextPlot(id="chart-tau")

    def watch_chosen(self, chosen: str) -> None:
        for plot in self.query(PlotextPlot):
            plot.set_class(plot.id == chosen, "-chosen")

    def switch(self) -> None:
        """Show the next of the charts a compact layout shows one at a time."""
        self.chosen = self._after(self.chosen)

    @property
    def chosen_name(self) -> str:
        return dict(SINGLE_CHARTS).get(self.chosen, "")

    def chosen_name_after(self) -> str:
        """What `switch` would show."""
        return dict(SINGLE_CHARTS)[self._after(self.chosen)]

    @staticmethod
    def _after(plot_id: str) -> str:
        ids = [plot_id for plot_id, _ in SINGLE_CHARTS]
        return ids[(ids.index(plot_id) + 1) % len(ids)] if plot_id in ids else ids[0]

    def show_run(self, run: RunView | None) -> None:
        history = () if run is None else run.history
        # Redraw only when the points changed: plotext rebuilds the whole figure on every render.
        shown = (None if run is None else run.run_id, len(history), history[-1] if history else None)
        if shown == self._shown:
            return
        self._shown = shown
        self._draw(self.query_one("#chart-loss", PlotextPlot), "loss", history, LOSS)
        self._draw(self.query_one("#chart-acc", PlotextPlot), "acc · streak", history, ACCURACY)
        self._draw(self.query_one("#chart-toks", PlotextPlot), "Ktok/s", history, THROUGHPUT)
        # no legend: it would hide the curves' ends in a small plot; the title names the colours
        trees = tree_series(history)
        title = "τ train·held" + "".join(f"·{label}" for label, *_ in trees)
        self._draw(self.query_one("#chart-tau", PlotextPlot), title, history, TAU + trees, legend=False)

    @staticmethod
    def _draw(plot: PlotextPlot, title: str, history: tuple[MetricPoint, ...], series: tuple[Series, ...], *,
              legend: bool = True) -> None:
        draw_chart(plot.plt, title, history, series, legend=legend)
        plot.refresh()


def draw_chart(plt, title: str, history: tuple[MetricPoint, ...], series: tuple[Series, ...], *,
               legend: bool = True) -> None:
    """Draw `series` of `history` over the steps into the plotext figure `plt` (cleared first)."""
    plt.clear_figure()
    plt.title(title)
    all_steps: list[int] = []
    for label, field, colour, side in series:
        steps, values = finite_points(history, field)
        if steps:
            plt.plot(steps, values, label=label if legend and len(series) > 1 else None, color=colour,
                     yside=side, marker="braille")
            all_steps.extend(steps)
    if all_steps:
        label_steps(plt, step_ticks(min(all_steps), max(all_steps)))


def label_steps(plt, ticks: list[int]) -> None:
    """Label the x axis at `ticks`, and where labels crowd keep the latest step, then the first, then the rest.

    plotext dedupes the (tick, label) pairs through a set, so it stores them in an order that follows the
    string hash seed, and draws them in that order, dropping each label that would touch one already drawn:
    which labels a narrow chart showed changed from one process to the next. The pairs are put back in our
    order after plotext has checked them (tests/tui/test_chart_ticks.py fails if plotext stops keeping them
    where this looks)."""
    plt.xticks(ticks, [str(tick) for tick in ticks])
    kept = sorted(set(ticks), key=lambda tick: (tick != ticks[-1], tick != ticks[0], tick))
    monitor, lower = plt.monitor, plt.monitor.xside_to_pos(None)
    if sorted(monitor.xticks[lower]) == sorted(kept):
        monitor.xticks[lower] = kept
        monitor.xlabels[lower] = [str(tick) for tick in kept]


def finite_points(history: tuple[MetricPoint, ...], field: Callable[[MetricPoint], float | None]
                  ) -> tuple[list[int], list[float]]:
    """The points where `field` has a finite value: NaN and inf are alerts, not chart points."""
    steps: list[int] = []
    values: list[float] = []
    for point in history:
        value = field(point)
        if value is not None and math.isfinite(value):
            steps.append(point.step)
            values.append(value)
    return steps, values


def step_ticks(first: int, last: int, *, count: int = 3) -> list[int]:
    """A few whole, evenly spread steps from first to last (plotext would label steps with decimals)."""
    if last <= first:
        return [first]
    spread = (last - first) / (count - 1)
    return sorted({round(first + spread * i) for i in range(count)})
