"""One line above the selected run's charts: the stage that bounds it and the evidence; hidden while there is
no verdict (an ended run, or a log that says nothing about its pipeline)."""
from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.widget import Widget

from orchestrator.watch.model import Bottleneck, RunView

STYLES = {"data": "yellow", "target": "cyan", "drafter": "magenta", "communication": "blue", "host": "red"}


class BottleneckLine(Widget):
    DEFAULT_CSS = """
    BottleneckLine { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._verdict: Bottleneck | None = None
        self.display = False

    def show_run(self, run: RunView | None) -> None:
        verdict = None if run is None else run.bottleneck
        if verdict != self._verdict:
            self._verdict = verdict
            self.display = verdict is not None
            self.refresh()

    def render(self) -> Text:
        verdict = self._verdict
        if verdict is None:
            return Text("")
        label = "host (GPU idle)" if verdict.bound_by == "host" else verdict.bound_by
        evidence = verdict.evidence.split(": ", 1)[-1]
        return Text.from_markup(f"[b]bound by:[/] [b {STYLES.get(verdict.bound_by, 'white')}]{escape(label)}[/]"
                                f"  [dim]{escape(evidence)}[/]", overflow="ellipsis")
