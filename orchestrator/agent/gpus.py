"""GPU memory and utilisation from nvidia-smi. Only per-GPU numbers: inside LXC its process list is empty or
shows host PIDs, so nothing here ever matches nvidia-smi PIDs to processes."""
from __future__ import annotations

import shutil
import subprocess

from .protocol import GPU_HELD_MIB, GPU_MEMORY_FIELDS, gpu_query_args

TIMEOUT_S = 15.0


def _number(text: str) -> int | None:
    try:
        return int(float(text.strip().split()[0]))
    except (ValueError, IndexError):
        return None  # "[N/A]", "[Not Supported]"


def parse_query(text: str) -> list:
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 3 and _number(fields[0]) is not None:
            gpus.append({"index": _number(fields[0]), "memory_used_mib": _number(fields[1]),
                         "utilization_pct": _number(fields[2])})
    return gpus


def query_gpus() -> dict:
    """{"available": bool, "gpus": [...], "error": str | None}."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return {"available": False, "gpus": [], "error": None}
    try:
        done = subprocess.run([binary] + gpu_query_args(GPU_MEMORY_FIELDS), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S,
                              universal_newlines=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"available": True, "gpus": [], "error": str(exc)}
    if done.returncode != 0:
        return {"available": True, "gpus": [], "error": (done.stderr or done.stdout).strip()[-500:]}
    return {"available": True, "gpus": parse_query(done.stdout), "error": None}


def held_without_run(gpus: list, live_gpu_sets: list) -> list:
    """GPUs holding memory that no live run accounts for (a live run without --gpus may use any GPU)."""
    if any(s is None for s in live_gpu_sets):
        return []
    claimed = set()
    for gpu_set in live_gpu_sets:
        claimed.update(gpu_set)
    return [g for g in gpus if (g["memory_used_mib"] or 0) >= GPU_HELD_MIB and g["index"] not in claimed]
