"""Room for a checkpoint: how big the next save will be, whether the disk has it, and a full disk named as such.

A save that runs out of space fails deep inside torch ("PytorchStreamWriter failed writing file ...: unexpected
pos") or safetensors ("No space left on device", os error 28), leaving a half-written temp dir that eats the
space the next save needs. The estimate lets a save be refused before it starts; `is_disk_full` recognises the
failure when the estimate was short (another process filled the disk meanwhile).
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import torch

from trainer.errors import TrainerError

MARGIN = 1.05               # serialisation headers, pickled Python objects, the JSON files
MARGIN_BYTES = 256 * 1024    # ...and a floor for tiny models
FULL_DISK_MARKERS = ("unexpected pos", "No space left on device", "os error 28", "code: 28")


class DiskFull(TrainerError):
    """A checkpoint did not fit: refused before it was written, or cut short by a full disk. Not bad input: a
    run that stops for it exits 1, as a failed operation does."""

    exit_code = 1


def state_bytes(value) -> int:
    """The bytes of every tensor in a nested dict/list/tuple (a state_dict, an optimizer state)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(v) for v in value)
    return 0


def estimate_save_bytes(drafter_tensors_bytes: int, *, save_dtype_bytes: int, master_dtype_bytes: int,
                        state: dict) -> int:
    """The size of one step_N/: the weights in the save dtype, the master weights where those differ, the
    training state (optimizer moments, RNG), with a margin."""
    weights = drafter_tensors_bytes // master_dtype_bytes * save_dtype_bytes
    master = drafter_tensors_bytes if save_dtype_bytes != master_dtype_bytes else 0
    return int((weights + master + state_bytes(state)) * MARGIN) + MARGIN_BYTES


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem of `path` (or of its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_room(output_dir: Path, needed: int) -> None:
    free = free_bytes(output_dir)
    if free < needed:
        raise DiskFull(f"not enough space for a checkpoint at {output_dir}: {free} bytes free, save needs "
                       f"~{needed}")


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC (or a quota's EDQUOT), or the message torch and safetensors give when a write hit a full disk."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(marker in str(exc) for marker in FULL_DISK_MARKERS)


def disk_full_error(output_dir: Path, needed: int) -> DiskFull:
    return DiskFull(f"disk full at {output_dir}: {free_bytes(output_dir)} bytes free, save needs ~{needed}")
