"""The newest lines of the selected run's log, as many as fit, with exceptions highlighted."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from orchestrator.watch.model import RunView

from ..loghighlight import exception_line_set, styled_line


class LogTail(Widget):
    DEFAULT_CSS = """
    LogTail { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: tuple[str, ...] = ()
        self._exception_texts: tuple[str, ...] = ()
        self._exception_lines: frozenset[str] = frozenset()

    def show_run(self, run: RunView | None) -> None:
        lines = () if run is None else run.log_tail
        texts = () if run is None else run.exception_texts
        changed = lines != self._lines
        if texts != self._exception_texts:
            self._exception_texts = texts
            self._exception_lines = exception_line_set(texts)
            changed = True
        if changed:
            self._lines = lines
            self.refresh()

    def render(self) -> Text:
        if not self._lines:
            return Text("no log lines yet", style="dim")
        height = max(self.size.height, 1)
        shown = [styled_line(line, self._exception_lines) for line in self._lines[-height:]]
        return Text("\n", no_wrap=True, overflow="ellipsis").join(shown)
