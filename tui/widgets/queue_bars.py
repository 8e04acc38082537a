"""Queue depths of the selected run: one bar per prefetch (q_pre) and hidden-state (q_hs) queue."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from orchestrator.watch.model import RunView

LABEL_CHARS = 10
VALUE_CHARS = 4
BLOCKS = "▁▂▃▄▅▆▇█"


class QueueBars(Widget):
    DEFAULT_CSS = """
    QueueBars { height: auto; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._run: RunView | None = None
        # The deepest each queue family has been seen per run: the source does not know the queues' capacity.
        self._peaks: dict[tuple[str, str], int] = {}

    def show_run(self, run: RunView | None) -> None:
        if run is not None:
            for family, depths in (("pre", run.q_pre), ("hs", run.q_hs)):
                key = (run.run_id, family)
                self._peaks[key] = max([self._peaks.get(key, 0), *depths])
        if run != self._run:
            self._run = run
            self.refresh(layout=True)

    def render(self) -> Text:
        run = self._run
        if run is None or not (run.q_pre or run.q_hs):
            return Text("no queue depths yet", style="dim")
        # a family the run has no queue of (this trainer's q_hs=[]: its features are computed in the step) is
        # left out, not shown as a label without a value
        families = [(family, depths, style, max(self._peaks.get((run.run_id, family), 0), 1))
                    for family, depths, style in (("pre", run.q_pre, "blue"), ("hs", run.q_hs, "magenta"))
                    if depths]
        # One line per queue needs room; the compact layout gets one line per family.
        if self.screen.has_class("-compact"):
            lines = [family_line(f"q_{family}", depths, peak, style) for family, depths, style, peak in families]
        else:
            width = max(self.size.width - LABEL_CHARS - VALUE_CHARS - 1, 4)
            lines = [queue_line(f"q_{family}[{index}]", depth, peak, width, style)
                     for family, depths, style, peak in families for index, depth in enumerate(depths)]
        return Text("\n", no_wrap=True, overflow="crop").join(lines)


def family_line(label: str, depths: tuple[int, ...], peak: int, style: str) -> Text:
    """A label, one block per queue scaled to `peak`, and the depths: `q_pre ▇▇▇▇▇ 50 50 50 49 50`."""
    line = Text(f"{label:<6}")
    for depth in depths:
        level = round(min(max(depth, 0) / peak, 1.0) * (len(BLOCKS) - 1))
        line.append(BLOCKS[level], "bold red" if depth == 0 else style)
    line.append(" " + " ".join(str(depth) for depth in depths), "dim")
    return line


def queue_line(label: str, depth: int, peak: int, width: int, style: str) -> Text:
    """A label, a bar of `depth / peak` of `width` cells (eighths for the last cell), and the depth."""
    eighths = round(max(depth, 0) / peak * width * 8)
    full, rest = divmod(min(eighths, width * 8), 8)
    bar = "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])
    empty_style = "bold red" if depth == 0 else "dim"
    return Text.assemble(
        (f"{label:<{LABEL_CHARS}}", empty_style if depth == 0 else ""),
        (bar, style),
        (" " * (width - len(bar)), ""),
        (f" {depth:>{VALUE_CHARS - 1}}", empty_style if depth == 0 else ""),
    )
