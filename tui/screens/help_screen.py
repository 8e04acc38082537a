"""`?`: every key of the dashboard, read from the bindings themselves so that the list cannot go stale."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Static

# (section title, the classes whose bindings it lists, whether inherited bindings count)
HelpSection = tuple[str, Sequence[type[DOMNode]], bool]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > #help-dialog {
        width: 64; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
        border-title-style: bold; border-title-color: $text;
    }
    HelpScreen #help-keys { height: auto; max-height: 100%; }
    """
    BINDINGS = [Binding("question_mark,escape,q", "close", "Close help")]

    def __init__(self, sections: Sequence[HelpSection]) -> None:
        super().__init__()
        self.sections = tuple(sections)

    def compose(self) -> ComposeResult:
        # the title sits on the border so that the scrolled keys are the dialog's only child: a title line
        # beside them pushed the last key below the dialog's edge at 80x24, out of reach of any scrolling
        with Vertical(id="help-dialog") as dialog:
            dialog.border_title = "Keys (? escape or q closes; arrows scroll)"
            with VerticalScroll(id="help-keys"):
                yield Static(self.keys_text(), id="help-text")

    def keys_text(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        listed: set[tuple[str, str]] = set()
        for title, classes, inherited in self.sections:
            # keys every screen has (tab, copy) are listed once, in the first section
            rows = [row for row in key_rows(classes, inherited=inherited, display=self.app.get_key_display)
                    if row not in listed]
            listed.update(rows)
            if not rows:
                continue
            text.append(f"{title}\n", style="bold underline")
            width = max(len(keys) for keys, _ in rows)
            for keys, description in rows:
                text.append(f"  {keys:<{width}}  ", style="bold")
                text.append(f"{description}\n")
        text.rstrip()
        return text

    def action_close(self) -> None:
        self.dismiss(None)


def key_rows(classes: Sequence[type[DOMNode]], *, inherited: bool, display=lambda binding: binding.key
             ) -> list[tuple[str, str]]:
    """(keys, what they do) per action of the classes' bindings, in declaration order; keys bound to the same
    action read together (`n / escape`). System bindings and bindings without a description are left out."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for cls in classes:
        bindings = (binding for bound in cls._merged_bindings.key_to_bindings.values() for binding in bound) \
            if inherited else Binding.make_bindings(cls.BINDINGS)
        for binding in bindings:
            if binding.system or not binding.description:
                continue
            action = binding.action.removeprefix("app.")  # `q` on a screen and ctrl+q on the app both quit
            keys = grouped.setdefault((action, binding.description), [])
            key = display(binding)
            if key not in keys:
                keys.append(key)
    return [(" / ".join(keys), description) for (_, description), keys in grouped.items()]
