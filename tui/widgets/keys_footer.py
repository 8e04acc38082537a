"""The key bindings line at the bottom, shown whether or not the page around the dashboard has the focus."""
from __future__ import annotations

from textual.widgets import Footer


class KeysFooter(Footer):
    """Textual's footer skips its bindings while the app is blurred, which a dashboard served to a browser
    (`watch --serve`) is from the start, until the page is clicked: the footer stayed blank until the first key
    press. The keys are worth showing before that: this one draws them either way."""

    def bindings_changed(self, screen) -> None:
        self._bindings_ready = True
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self.recompose)
