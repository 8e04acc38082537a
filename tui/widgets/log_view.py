"""A whole run log, any length: draws only the visible lines and asks for the ones it lacks (Line API)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer

from ..loghighlight import clean_line, styled_line

MAX_CACHED_LINES = 20_000
# What stands where a line is not here yet: the count or the lines are on their way (over SSH, a moment)
COUNTING = "loading the log…"
PLACEHOLDER = "loading…"
EMPTY = "the log is empty"
SETTLE_S = 0.05
REASK_AFTER_S = 2.0


class LogView(ScrollView, can_focus=True):
    """Holds only fetched lines; posts WindowWanted for missing visible ones and never reads anything itself."""

    COMPONENT_CLASSES = {"log-view--gutter"}
    DEFAULT_CSS = """
    LogView { height: 1fr; }
    LogView > .log-view--gutter { color: $text-muted; }
    """

    @dataclass
    class WindowWanted(Message):
        """Lines [start, end) are visible and not here yet."""

        start: int
        end: int  # not `stop`: that name is Message.stop()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: dict[int, str] = {}
        self._line_count = 0
        self._counted = False  # no count yet: the view says it is loading instead of showing nothing
        self._widest = 0
        self._wanted: tuple[int, int] | None = None
        self._wanted_at = 0.0
        self._exception_lines: frozenset[str] = frozenset()
        self._settle_timer: Timer | None = None
        self.follow = True  # stay at the end while new lines arrive, like `tail -f`

    @property
    def line_count(self) -> int:
        return self._line_count

    def visible_window(self) -> tuple[int, int]:
        height = self.scrollable_content_region.height
        if self.follow:
            # the end, even before the scroll lands there (a new line count applies after the next refresh):
            # asking for the top first left a small screen showing only placeholders until a second answer
            start = max(self._line_count - height, 0)
        else:
            start = max(int(self.scroll_offset.y), 0)
        return start, min(start + height, self._line_count)

    def set_exception_lines(self, lines: frozenset[str]) -> None:
        self._exception_lines = lines
        self.refresh()

    def set_line_count(self, count: int) -> None:
        if count < self._line_count:  # the log was truncated or replaced: what we hold is stale
            self._lines.clear()
        self._line_count = count
        self._counted = True
        self._resize_virtual()
        # After the refresh: only then does the new virtual size bound the scroll position.
        self.call_after_refresh(self._follow_end if self.follow else self._want_missing)

    def add_lines(self, start: int, lines: list[str]) -> None:
        if len(self._lines) + len(lines) > MAX_CACHED_LINES:
            self._lines.clear()  # cheap to fetch again: only the visible window is ever asked for
        for offset, raw in enumerate(lines):
            text = clean_line(raw)
            self._lines[start + offset] = text
            self._widest = max(self._widest, len(text))
        self._wanted = None
        self._resize_virtual()
        self.refresh()
        if self.follow:
            # a line wider than the view brings the horizontal scrollbar, a row less to show: end there again
            self.call_after_refresh(self._follow_end)
        else:
            self._want_missing()

    # Jumps without animation: an animated jump across millions of lines would pass through (and ask for)
    # windows nobody looks at.
    def action_scroll_home(self) -> None:
        self.scroll_home(animate=False)

    def action_scroll_end(self) -> None:
        self.scroll_end(animate=False)

    def action_page_up(self) -> None:
        self.scroll_page_up(animate=False)

    def action_page_down(self) -> None:
        self.scroll_page_down(animate=False)

    def _follow_end(self) -> None:
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        self._want_missing()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.follow = round(new_value) >= self.max_scroll_y
        self._want_missing()

    def on_resize(self) -> None:
        self._want_missing()

    def _gutter_width(self) -> int:
        return len(str(max(self._line_count, 1))) + 1

    def _resize_virtual(self) -> None:
        self.virtual_size = Size(self._widest + self._gutter_width() + 1, self._line_count)

    def _want_missing(self) -> None:
        """Ask for the missing visible lines once the view stops moving: a scroll animation passes through
        thousands of positions, and each request may cross an SSH connection."""
        if self._settle_timer is not None:
            self._settle_timer.stop()
        self._settle_timer = self.set_timer(SETTLE_S, self._request_missing)

    def missing_lines(self) -> list[int]:
        """Visible line numbers not fetched yet."""
        start, stop = self.visible_window()
        return [line for line in range(start, stop) if line not in self._lines]

    def _request_missing(self) -> None:
        self._settle_timer = None
        missing = self.missing_lines()
        if not missing:
            return
        wanted = (missing[0], missing[-1] + 1)
        # The same window again only after a while: its answer may be on its way, or its request failed.
        if wanted != self._wanted or time.monotonic() - self._wanted_at > REASK_AFTER_S:
            self._wanted, self._wanted_at = wanted, time.monotonic()
            self.post_message(self.WindowWanted(*wanted))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        line_no = scroll_y + y
        width = self.scrollable_content_region.width
        style = self.rich_style
        if line_no >= self._line_count:
            if line_no > 0:
                return Strip.blank(width, style)
            note = Text.styled(EMPTY if self._counted else COUNTING, "dim italic")
            note.stylize_before(style)
            return Strip(note.render(self.app.console)).crop_extend(0, width, style)
        gutter = self._gutter_width()
        number = Segment(f"{line_no + 1:>{gutter - 1}} ", style + self.get_component_rich_style("log-view--gutter"))
        text = self._lines.get(line_no)
        line = Text.styled(PLACEHOLDER, "dim italic") if text is None else styled_line(text, self._exception_lines)
        line.stylize_before(style)
        body = Strip(line.render(self.app.console)).crop_extend(scroll_x, scroll_x + width - gutter, style)
        return Strip([number, *body], width)
