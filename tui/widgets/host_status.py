"""One line: every host with its connection state, and when the snapshot was taken."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from orchestrator.display import clip, format_bytes
from orchestrator.watch.model import HostView

MAX_ERROR_CHARS = 60


class HostStatus(Widget):
    DEFAULT_CSS = """
    HostStatus { height: 1; }
    """

    hosts: reactive[tuple[HostView, ...]] = reactive(())
    taken_at: reactive[str] = reactive("")
    source_error: reactive[str] = reactive("")

    def show(self, hosts: Sequence[HostView], taken_at: str) -> None:
        self.hosts = tuple(hosts)
        self.taken_at = taken_at
        self.source_error = ""

    def render(self) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("hosts ", style="bold")
        if not self.hosts:
            line.append("none yet ", style="dim")
        for host in self.hosts:
            line.append_text(host_text(host))
            line.append("  ")
        if self.source_error:
            line.append(f"source error: {self.source_error}", style="bold red")
        elif self.taken_at:
            line.append(f"· {clock_time(self.taken_at)}", style="dim")
        return line


def host_text(host: HostView) -> Text:
    if host.connected:
        text = Text.assemble(("● ", "green"), host.name)
        if host.free_bytes is not None:  # the room its runs' logs and checkpoints have left
            text.append(f" {format_bytes(host.free_bytes)} free", style="bold red" if host.low_disk else "dim")
        if host.unreachable:  # the host answers, these containers of it do not
            names = ", ".join(name.rsplit("/", 1)[-1] for name in host.unreachable)
            text.append(f" ({names} not answering)", style="bold yellow")
        return text
    text = Text.assemble(("✗ ", "bold red"), (host.name, "bold red"), " disconnected")
    if host.error:
        error = clip(host.error, MAX_ERROR_CHARS)
        text.append(f": {error}")
    if host.reconnecting:
        text.append(" (reconnecting...)", style="dim")
    elif host.retry_in_s is not None:
        text.append(f" (retry in {host.retry_in_s:.0f} s)", style="dim")
    return text


def clock_time(iso: str) -> str:
    """HH:MM:SS of an ISO 8601 time, or the text itself when it is not one."""
    if "T" in iso and len(iso) >= 19:
        return iso[11:19]
    return iso
