"""nvidia-smi's CSV query output, parsed. Pure functions: the callers run the command.

Inside an LXC container nvidia-smi lists no processes (or host PIDs), so nothing here reads the process list.
"""
from __future__ import annotations

from dataclasses import dataclass

from .agent.protocol import GPU_FIELDS, ascii_decimal, gpu_query_args

NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None

    def as_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "memory_used_mib": self.memory_used_mib,
                "memory_total_mib": self.memory_total_mib, "utilization_pct": self.utilization_pct}


def query_argv(fields: tuple[str, ...] = GPU_FIELDS, *, loop_s: int | None = None) -> list[str]:
    argv = ["nvidia-smi", *gpu_query_args(fields)]
    return argv + [f"--loop={loop_s}"] if loop_s else argv


def parse_query_csv(text: str, fields: tuple[str, ...] = GPU_FIELDS) -> list[GpuInfo]:
    """Rows of `--query-gpu=<fields> --format=csv[,noheader][,nounits]`; units and a header are tolerated."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        index = ascii_decimal(cells[0])
        if len(cells) != len(fields) or index is None:
            continue  # the header, a blank line, or a line cut short
        row = dict(zip(fields, cells))
        gpus.append(GpuInfo(
            index=index,
            uuid=_text(row.get("uuid")),
            name=_text(row.get("name")),
            memory_used_mib=_number(row.get("memory.used")),
            memory_total_mib=_number(row.get("memory.total")),
            utilization_pct=_number(row.get("utilization.gpu")),
        ))
    return gpus


def _text(cell: str | None) -> str | None:
    return None if cell is None or cell in NOT_AVAILABLE else cell


def _number(cell: str | None) -> float | None:
    if cell is None or cell in NOT_AVAILABLE:
        return None
    value = cell.split()[0]  # "88283 MiB" -> "88283", "0 %" -> "0"
    try:
        return float(value)
    except ValueError:
        return None
