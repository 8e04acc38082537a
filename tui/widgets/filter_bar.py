"""The `/` filter: hidden until asked for; filters the runs table as you type."""
from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class FilterBar(Input):
    DEFAULT_CSS = """
    FilterBar { dock: bottom; display: none; }
    FilterBar.-active { display: block; }
    """
    BINDINGS = [
        Binding("enter", "submit", "Keep the filter"),  # Input's own binding, named here for the help screen
        Binding("escape", "clear_filter", "Clear the filter"),
    ]

    @dataclass
    class FilterChanged(Message):
        """The filter text changed (empty: no filter)."""

        text: str

    @dataclass
    class FilterDone(Message):
        """The user left the filter bar (enter or escape)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="filter runs by target, name or state (enter keeps it, escape clears)", id=id)

    def open(self) -> None:
        self.add_class("-active")
        self.focus()

    def action_clear_filter(self) -> None:
        self.value = ""
        self.remove_class("-active")
        self.post_message(self.FilterDone())

    @on(Input.Changed)
    def _text_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.FilterChanged(event.value.strip()))

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.value.strip():
            self.remove_class("-active")
        self.post_message(self.FilterDone())


def run_matches(filter_text: str, *fields: str | None) -> bool:
    """Case-insensitive: every word of the filter occurs in one of the fields."""
    haystack = " ".join(field for field in fields if field).lower()
    return all(word in haystack for word in filter_text.lower().split())
