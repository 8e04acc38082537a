"""GPU memory and utilisation from nvidia-smi, as the GPU rows of dflash_records/gpu.py (which parses them).

Only per-GPU numbers: inside LXC its process list is empty or shows host PIDs, so nothing here ever matches
nvidia-smi PIDs to processes."""
from __future__ import annotations

import shutil
import subprocess

from dflash_records.gpu import GPU_MEMORY_FIELDS, gpu_query_args, parse_query_csv

TIMEOUT_S = 15.0


def query_gpus() -> dict:
    """{"available": bool, "gpus": [GpuRow], "error": str | None}."""
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
    return {"available": True, "gpus": parse_query_csv(done.stdout, GPU_MEMORY_FIELDS), "error": None}
