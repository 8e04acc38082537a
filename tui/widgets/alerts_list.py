"""Every alert of the snapshot, newest first: time, run, message, coloured by severity."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from orchestrator.alertkinds import ERROR, INFO, WARNING
from orchestrator.watch.model import AlertView

from .host_status import clock_time

SEVERITY_STYLES = {ERROR: "bold red", WARNING: "yellow", INFO: "cyan"}
MAX_ALERTS_SHOWN = 200


class AlertsList(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    AlertsList { height: 1fr; }
    AlertsList > Static { width: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._alerts: tuple[AlertView, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static(Text("no alerts", style="dim"), id="alerts-text")

    def show_alerts(self, alerts: Sequence[AlertView]) -> None:
        alerts = tuple(alerts)
        if alerts == self._alerts:
            return
        self._alerts = alerts
        newest_first = reversed(alerts[-MAX_ALERTS_SHOWN:])
        lines = [alert_line(alert) for alert in newest_first]
        content = Text("\n", no_wrap=True, overflow="ellipsis").join(lines) if lines else Text("no alerts",
                                                                                                style="dim")
        self.query_one("#alerts-text", Static).update(content)
        self.border_title = f"alerts ({len(alerts)})"


def alert_line(alert: AlertView) -> Text:
    style = SEVERITY_STYLES.get(alert.severity, "")
    return Text.assemble(
        (clock_time(alert.time), "dim"),
        " ",
        (alert.run_id or alert.target or "-", "bold"),
        " ",
        (alert.message.replace("\n", " ⏎ "), style),
    )
