"""The GPUs of the selected run's target: memory, utilisation, and a utilisation history sparkline."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from orchestrator.display import format_gib
from orchestrator.watch.model import GpuView

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
NO_SAMPLES = "no GPU samples"
PREFIX_CHARS = 21


class GpuPanel(Widget):
    DEFAULT_CSS = """
    GpuPanel { height: auto; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._gpus: tuple[GpuView, ...] = ()
        self._run_gpus: tuple[int, ...] = ()
        self._why_none = ""

    def show(self, gpus: Sequence[GpuView], run_gpus: Sequence[int] = (), *, why_none: str = "") -> None:
        """`why_none`: what the target said instead of samples (`nvidia-smi is not installed`)."""
        gpus, run_gpus = tuple(gpus), tuple(run_gpus)
        if (gpus, run_gpus, why_none) != (self._gpus, self._run_gpus, self._why_none):
            self._gpus, self._run_gpus, self._why_none = gpus, run_gpus, why_none
            self.refresh(layout=True)

    def render(self) -> Text:
        if not self._gpus:
            return Text(self._why_none or NO_SAMPLES, style="dim")
        spark_width = max(self.size.width - PREFIX_CHARS, 0)
        lines = [gpu_line(gpu, gpu.row.index in self._run_gpus, spark_width) for gpu in self._gpus]
        return Text("\n", no_wrap=True, overflow="crop").join(lines)


def gpu_line(view: GpuView, used_by_run: bool, spark_width: int) -> Text:
    gpu = view.row
    marker = "▸" if used_by_run else " "
    memory = f"{format_gib(gpu.memory_used_mib)}/{format_gib(gpu.memory_total_mib)}G"
    util = "  -%" if gpu.utilization_pct is None else f"{gpu.utilization_pct:3.0f}%"
    style = "bold yellow" if gpu.idle_and_held else ("bold" if used_by_run else "")
    prefix = f"{marker}{gpu.index:>2} {memory:>11} {util:>4} "
    return Text.assemble((prefix.ljust(PREFIX_CHARS), style),
                         (sparkline(view.utilization_history, spark_width), "green"))


def sparkline(values: Sequence[float], width: int, *, top: float = 100.0) -> str:
    """The newest `width` values on a fixed 0..top scale, so that an idle GPU reads as idle, not as noise."""
    if width <= 0:
        return ""
    blocks = []
    for value in list(values)[-width:]:
        share = min(max(value / top, 0.0), 1.0)
        blocks.append(SPARK_BLOCKS[round(share * (len(SPARK_BLOCKS) - 1))])
    return "".join(blocks)
