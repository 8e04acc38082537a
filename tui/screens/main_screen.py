"""The main screen: hosts, the runs table, and the selected run's charts, queues, GPUs, log tail and alerts.

Below FULL_WIDTH columns or FULL_HEIGHT rows it is compact (the `-compact` class; `-narrow` and `-short` say
which way): one chart at a time and a line for the GPUs instead of their panel. The runs table drops to the
columns that matter most whenever all of them would not fit (RunsTable.narrow), so that 80x24 shows them all
without scrolling sideways.
"""
from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.markup import escape
from textual.containers import Horizontal, Vertical
from textual.geometry import Size
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable

from orchestrator.watch.model import RunView, Snapshot

from ..messages import CleanupRequested, KillRequested, LogRequested
from ..runcells import run_label
from ..widgets.alerts_list import AlertsList
from ..widgets.bottleneck_line import BottleneckLine
from ..widgets.filter_bar import FilterBar, run_matches
from ..widgets.gpu_panel import GpuPanel
from ..widgets.gpu_summary import GpuSummary
from ..widgets.host_status import HostStatus
from ..widgets.keys_footer import KeysFooter
from ..widgets.log_tail import LogTail
from ..widgets.metric_charts import MetricCharts
from ..widgets.queue_bars import QueueBars
from ..widgets.runs_table import RunsTable

FULL_WIDTH = 100
FULL_HEIGHT = 32


class MainScreen(Screen):
    BINDINGS = [
        Binding("k", "kill", "Kill"),
        Binding("l", "log", "Log"),
        Binding("c", "cleanup", "Cleanup"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("m", "switch_chart", "Switch chart"),
        Binding("q", "app.quit", "Quit"),
    ]

    compact: reactive[bool] = reactive(False, init=False)

    def __init__(self) -> None:
        super().__init__()
        self.snapshot = Snapshot(taken_at="")
        self.filter_text = ""
        self._composed = False  # a snapshot may arrive before the widgets exist; it is shown on mount

    def compose(self) -> ComposeResult:
        yield HostStatus(id="hosts")
        yield RunsTable(id="runs")
        yield GpuSummary(id="gpu-line")
        with Horizontal(id="detail"):
            with Vertical(id="detail-main"):
                yield BottleneckLine(id="bottleneck")
                yield MetricCharts(id="charts")
                yield LogTail(id="log-tail")
            with Vertical(id="detail-side"):
                yield QueueBars(id="queues")
                yield GpuPanel(id="gpus")
                yield AlertsList(id="alerts")
        yield FilterBar(id="filter")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#queues").border_title = "queues"
        self.query_one("#alerts").border_title = "alerts"
        self.query_one(RunsTable).focus()
        self._composed = True
        self._fit(self.app.size)
        self.show_snapshot(self.snapshot)

    @on(events.Resize)
    def _resized(self, event: events.Resize) -> None:
        self._fit(event.size)

    @on(events.ScreenResume)
    def _resumed(self) -> None:  # the terminal may have been resized while another screen was on top
        self._fit(self.app.size)

    def _fit(self, size: Size) -> None:
        narrow, short = size.width < FULL_WIDTH, size.height < FULL_HEIGHT
        self.set_class(narrow, "-narrow")
        self.set_class(short, "-short")
        self.compact = narrow or short

    def watch_compact(self, compact: bool) -> None:
        self.set_class(compact, "-compact")
        self.refresh_bindings()  # the chart key only does something in the compact layout
        if self._composed:
            self.query_one(QueueBars).refresh(layout=True)
            self._show_selected()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "switch_chart":
            return self.compact
        return True

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        if not self._composed:
            return
        try:
            self.query_one(HostStatus).show(snapshot.hosts, snapshot.taken_at)
        except NoMatches:  # the app is closing: its widgets went before the screen, and the source's worker
            return         # had posted one more snapshot
        self.query_one(AlertsList).show_alerts(snapshot.alerts)
        self._show_runs()

    def show_source_error(self, error: str) -> None:
        if self._composed:
            self.query_one(HostStatus).source_error = error

    def selected_run(self) -> RunView | None:
        run_id = self.query_one(RunsTable).selected_run_id
        return next((run for run in self.snapshot.runs if run.run_id == run_id), None)

    def visible_runs(self) -> list[RunView]:
        return [run for run in self.snapshot.runs
                if run_matches(self.filter_text, run.target, run.name, run.run_id, run.state, run.sweep_id)]

    def _show_runs(self) -> None:
        table = self.query_one(RunsTable)
        table.show_runs(self.visible_runs(), among=self.snapshot.runs)
        filtered = f" · filter '{escape(self.filter_text)}'" if self.filter_text else ""
        table.border_title = f"runs ({table.row_count}/{len(self.snapshot.runs)}){filtered}"
        self._show_selected()

    def _show_selected(self) -> None:
        run = self.selected_run()
        targets = () if run is None else {node.target for node in run.nodes} or {run.target}
        gpus = [gpu for gpu in self.snapshot.gpus if gpu.target in targets]
        self.query_one(MetricCharts).show_run(run)
        self.query_one(QueueBars).show_run(run)
        self.query_one(BottleneckLine).show_run(run)
        errors = {target: self.snapshot.gpu_errors[target] for target in sorted(targets)
                  if target in self.snapshot.gpu_errors}
        # what the target said instead of samples; a job's nodes each say it of their own container
        why_none = "; ".join(errors.values() if len(targets) == 1 else (f"{t}: {e}" for t, e in errors.items()))
        self.query_one(GpuPanel).show(gpus, () if run is None else run.gpus, why_none=why_none)
        self.query_one(GpuSummary).show(gpus, ", ".join(sorted(targets)), why_none=why_none)
        self.query_one(LogTail).show_run(run)
        label = "" if run is None else f" · {escape(run_label(run))}"
        exceptions = f" · [b red]{run.exceptions} exception(s)[/]" if run is not None and run.exceptions else ""
        nodes = "" if run is None or not run.nodes else " · " + ", ".join(
            f"n{n.node_rank} {escape(n.target)} {n.state}" for n in run.nodes)  # a job: rank 0's log, every node
        self.query_one("#log-tail").border_title = f"log tail{label}{nodes}{exceptions}"
        charts = self.query_one(MetricCharts)
        charts.border_title = f"{charts.chosen_name if self.compact else 'metrics'}{label}"
        charts.border_subtitle = f"m: {charts.chosen_name_after()}" if self.compact else ""
        where = ", ".join(sorted(targets))
        self.query_one("#gpus").border_title = "GPUs" if run is None else f"GPUs · {escape(where)}"

    @on(DataTable.RowHighlighted, "#runs")
    def _row_highlighted(self) -> None:
        self._show_selected()

    @on(DataTable.RowSelected, "#runs")
    def _row_selected(self) -> None:
        self.action_log()

    @on(FilterBar.FilterChanged)
    def _filter_changed(self, message: FilterBar.FilterChanged) -> None:
        self.filter_text = message.text
        self._show_runs()

    @on(FilterBar.FilterDone)
    def _filter_done(self) -> None:
        self.query_one(RunsTable).focus()
        self._composed = True
        self.show_snapshot(self.snapshot)

    def action_switch_chart(self) -> None:
        self.query_one(MetricCharts).switch()
        self._show_selected()

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def action_kill(self) -> None:
        run = self._require_selected("kill")
        if run is not None:
            self.post_message(KillRequested(run))

    def action_log(self) -> None:
        run = self._require_selected("show the log of")
        if run is not None:
            self.post_message(LogRequested(run))

    def action_cleanup(self) -> None:
        run = self._require_selected("clean up the target of")
        if run is not None:
            self.post_message(CleanupRequested(run.target))

    def _require_selected(self, verb: str) -> RunView | None:
        run = self.selected_run()
        if run is None:
            self.notify(f"Select a run to {verb} first", severity="warning")
        return run
