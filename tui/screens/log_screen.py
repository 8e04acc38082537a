"""The full log of one run. Workers ask the source for the line count and for the visible window only."""
from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from orchestrator.watch.model import DashboardSource, RunView

from ..cancellable import sleep_unless_cancelled
from ..loghighlight import exception_line_set
from ..messages import LogFetchFailed, LogLineCount, LogLinesLoaded
from ..runcells import run_label
from ..widgets.keys_footer import KeysFooter
from ..widgets.log_view import LogView


class LogScreen(Screen):
    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "Back"),
        Binding("g", "top", "Top"),
        Binding("G", "bottom", "End (follow)"),
    ]
    DEFAULT_CSS = """
    LogScreen #log-header { height: 1; background: $panel; }
    """

    def __init__(self, source: DashboardSource, run: RunView, *, refresh_s: float) -> None:
        super().__init__()
        self._source = source
        self.run = run
        self._refresh_s = refresh_s
        self._last_error = ""

    def compose(self) -> ComposeResult:
        yield Static(Text(f"log of {run_label(self.run)} on {self.run.target}"), id="log-header")
        yield LogView(id="log-view")
        yield KeysFooter()

    def on_mount(self) -> None:
        view = self.query_one(LogView)
        view.set_exception_lines(exception_line_set(self.run.exception_texts))
        view.focus()
        self._follow_line_count()

    def show_run(self, run: RunView) -> None:
        """A newer view of the run, from a snapshot: its tracebacks mark their lines here too."""
        if run.exception_texts != self.run.exception_texts:
            self.query_one(LogView).set_exception_lines(exception_line_set(run.exception_texts))
        self.run = run

    def action_top(self) -> None:
        self.query_one(LogView).scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.query_one(LogView).scroll_end(animate=False)

    @work(thread=True, exclusive=True, group="log-count")
    def _follow_line_count(self) -> None:
        worker = get_current_worker()
        last = -1
        while not worker.is_cancelled:
            try:
                count = self._source.log_line_count(self.run.run_id)
            except Exception as error:  # a dropped connection must not end the screen; the next poll retries
                self.post_message(LogFetchFailed(f"{type(error).__name__}: {error}"))
                count = last
            if count != last and not worker.is_cancelled:
                last = count
                self.post_message(LogLineCount(self.run.run_id, count))
            sleep_unless_cancelled(worker, self._refresh_s)

    @work(thread=True, exclusive=True, group="log-window")
    def _fetch_window(self, start: int, stop: int) -> None:
        worker = get_current_worker()
        try:
            lines = self._source.log_lines(self.run.run_id, start, stop)
        except Exception as error:  # shown; the view asks again when it scrolls or after a while
            self.post_message(LogFetchFailed(f"{type(error).__name__}: {error}"))
            return
        if not worker.is_cancelled:
            self.post_message(LogLinesLoaded(self.run.run_id, start, list(lines)))

    @on(LogLineCount)
    def _line_count(self, message: LogLineCount) -> None:
        self._last_error = ""
        view = self.query_one(LogView)
        view.set_line_count(message.count)
        self.query_one("#log-header", Static).update(
            Text(f"log of {run_label(self.run)} on {self.run.target} · {message.count:,} lines"))

    @on(LogFetchFailed)
    def _fetch_failed(self, message: LogFetchFailed) -> None:
        if message.error != self._last_error:  # a source that stays down is reported once, not every poll
            self._last_error = message.error
            self.notify(f"log: {message.error}", severity="error", markup=False)

    @on(LogView.WindowWanted)
    def _window_wanted(self, message: LogView.WindowWanted) -> None:
        self._fetch_window(message.start, message.end)

    @on(LogLinesLoaded)
    def _lines_loaded(self, message: LogLinesLoaded) -> None:
        self.query_one(LogView).add_lines(message.start, message.lines)

