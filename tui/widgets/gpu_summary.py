"""One line for the GPUs of the selected run's target(s), for small terminals: each GPU's utilisation and
memory, as numbers when they fit the width and as one block per GPU when they do not."""
from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from dflash_records.gpu import GpuRow
from orchestrator.display import format_gib
from orchestrator.watch.model import GpuView

from .gpu_panel import NO_SAMPLES, sparkline


class GpuSummary(Widget):
    DEFAULT_CSS = """
    GpuSummary { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._gpus: tuple[GpuView, ...] = ()
        self._where = ""
        self._why_none = ""

    def show(self, gpus: Sequence[GpuView], where: str, *, why_none: str = "") -> None:
        gpus = tuple(gpus)
        if (gpus, where, why_none) != (self._gpus, self._where, self._why_none):
            self._gpus, self._where, self._why_none = gpus, where, why_none
            self.refresh()

    def render(self) -> Text:
        label = Text.assemble(("GPUs", "bold"), (f" {self._where}" if self._where else "", "bold"), " · ")
        if not self._gpus:
            return label + Text(self._why_none or NO_SAMPLES, style="dim")
        rows = [gpu.row for gpu in self._gpus]
        detailed = label + gpu_numbers(rows)
        if detailed.cell_len <= self.size.width:
            return detailed
        return label + gpu_blocks(rows)


def gpu_numbers(gpus: Sequence[GpuRow]) -> Text:
    """`0: 97% 68/96G  1: 96% 69/96G`: index, utilisation and memory of each GPU."""
    line = Text(no_wrap=True)
    for number, gpu in enumerate(gpus):
        util = "-" if gpu.utilization_pct is None else f"{gpu.utilization_pct:.0f}"
        style = "bold yellow" if gpu.idle_and_held else ""
        line.append("  " if number else "")
        memory = f"{format_gib(gpu.memory_used_mib, 0)}/{format_gib(gpu.memory_total_mib, 0)}G"
        line.append(f"{gpu.index}: {util}% {memory}", style)
    return line


def gpu_blocks(gpus: Sequence[GpuRow]) -> Text:
    """`util ▁▁▁▁ 0% mem ▇█▇█ 341/383G`: a block per GPU, idle ones holding memory in yellow."""
    line = Text("util ", no_wrap=True, overflow="crop")
    for gpu in gpus:
        style = "bold yellow" if gpu.idle_and_held else "green"
        line.append(sparkline([gpu.utilization_pct or 0.0], 1), style)
    utils = [gpu.utilization_pct for gpu in gpus if gpu.utilization_pct is not None]
    line.append(f" {sum(utils) / len(utils):.0f}% " if utils else " -% ")
    line.append("mem ")
    for gpu in gpus:
        share = 100.0 * (gpu.memory_used_mib or 0.0) / (gpu.memory_total_mib or 1.0)
        line.append(sparkline([share], 1), "blue")
    used = sum(gpu.memory_used_mib or 0.0 for gpu in gpus)
    total = sum(gpu.memory_total_mib or 0.0 for gpu in gpus)
    line.append(f" {format_gib(used, 0)}/{format_gib(total, 0)}G")
    return line
