"""nvidia-smi's CSV query output, parsed. Pure functions: the callers run the command.

Inside an LXC container nvidia-smi lists no processes (or host PIDs), so nothing here reads the process list.
"""
from __future__ import annotations

from dataclasses import dataclass

from .agent.gpus import parse_query
from .agent.protocol import GPU_FIELDS, gpu_query_args


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
    """Rows of `--query-gpu=<fields> --format=csv[,noheader][,nounits]` (the agent's parser, which runs on the
    targets too), as GpuInfo."""
    return [GpuInfo(**row) for row in parse_query(text, fields)]
