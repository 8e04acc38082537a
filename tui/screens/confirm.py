"""A yes/no question in a modal: y or enter confirms, n or escape cancels. Without a yes label it only informs:
no confirm button, and every key closes it as a no."""
from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > #dialog {
        width: 90%; max-width: 100; height: auto; max-height: 90%;
        border: thick $error; background: $surface; padding: 0 1;
    }
    ConfirmScreen #question { text-style: bold; width: 1fr; }
    ConfirmScreen #details { height: auto; max-height: 20; margin: 1 0; }
    ConfirmScreen #buttons { height: auto; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", priority=True),
        # Not a priority binding: once the user tabs to a button, enter presses that button (Cancel cancels).
        Binding("enter", "answer(True)", "Yes", show=False),
        Binding("n,escape", "answer(False)", "No", priority=True),
    ]
    # Nothing focused at first, so that enter reaches the screen's binding and confirms.
    AUTO_FOCUS = None

    def __init__(self, question: str, details: RenderableType = "", *, yes_label: str | None = "Yes") -> None:
        super().__init__()
        self.question = question
        self._details = details
        self._yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.question), id="question")
            with VerticalScroll(id="details"):
                yield Static(self._details, id="details-text")
            with Horizontal(id="buttons"):
                if self.can_confirm:
                    yield Button(f"{self._yes_label} (y)", variant="error", id="yes")
                yield Button("Cancel (n)" if self.can_confirm else "Close (n)", id="no")

    @property
    def can_confirm(self) -> bool:
        return self._yes_label is not None

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer and self.can_confirm)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
