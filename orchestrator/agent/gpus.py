"""GPU memory and utilisation from nvidia-smi, and the one parser of its CSV rows (the controller's too).

Only per-GPU numbers: inside LXC its process list is empty or shows host PIDs, so nothing here ever matches
nvidia-smi PIDs to processes."""
from __future__ import annotations

import shutil
import subprocess

from .protocol import GPU_FIELDS, GPU_HELD_MIB, GPU_MEMORY_FIELDS, ascii_decimal, gpu_query_args

TIMEOUT_S = 15.0
# nvidia-smi's query field -> the key its value has here and on the wire (memory in MiB, utilisation in %)
FIELD_KEYS = {"index": "index", "uuid": "uuid", "name": "name", "memory.used": "memory_used_mib",
              "memory.total": "memory_total_mib", "utilization.gpu": "utilization_pct"}
# what nvidia-smi prints for a value it cannot give (a MIG slice, an old driver, a fallen-off GPU)
NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}


def parse_query(text: str, fields: tuple = GPU_FIELDS) -> list:
    """One dict per GPU row of `--query-gpu=<fields> --format=csv[,noheader][,nounits]`, keyed by FIELD_KEYS
    (other fields are left out); a value nvidia-smi cannot give is None. A header, a blank line or a line cut
    short is skipped; units are tolerated."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields) or ascii_decimal(cells[0]) is None:
            continue
        row = {FIELD_KEYS[field]: _value(field, cell) for field, cell in zip(fields, cells) if field in FIELD_KEYS}
        row["index"] = ascii_decimal(cells[0])
        gpus.append(row)
    return gpus


def _value(field: str, cell: str):
    if cell in NOT_AVAILABLE:
        return None
    if field in ("uuid", "name"):
        return cell
    try:
        number = float(cell.split()[0])  # "88283 MiB" -> 88283, "0 %" -> 0
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


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
    return {"available": True, "gpus": parse_query(done.stdout, GPU_MEMORY_FIELDS), "error": None}


def held_without_run(gpus: list, live_gpu_sets: list) -> list:
    """GPUs holding memory that no live run accounts for (a live run without --gpus may use any GPU)."""
    if any(s is None for s in live_gpu_sets):
        return []
    claimed = set()
    for gpu_set in live_gpu_sets:
        claimed.update(gpu_set)
    return [g for g in gpus if (g["memory_used_mib"] or 0) >= GPU_HELD_MIB and g["index"] not in claimed]
