"""The controller's nvidia-smi command line. Its rows are dflash_records/gpu.py's GpuRow, parsed there (by
parse_query_csv, which runs on the targets too), and read by the doctor, watch and the dashboard.

Inside an LXC container nvidia-smi lists no processes (or host PIDs), so nothing here reads the process list.
"""
from __future__ import annotations

from dflash_records.gpu import GPU_FIELDS, gpu_query_args, parse_query_csv

__all__ = ["query_argv", "parse_query_csv"]


def query_argv(fields: tuple[str, ...] = GPU_FIELDS, *, loop_s: int | None = None) -> list[str]:
    argv = ["nvidia-smi", *gpu_query_args(fields)]
    return argv + [f"--loop={loop_s}"] if loop_s else argv
