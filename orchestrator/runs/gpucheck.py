"""Whether a launch asks for GPUs its target has: `--gpus` indices and `--gpu-count N`, checked against the
inventory's `gpus:`, else what nvidia-smi lists there, before anything is started or queued (a run queued for a
GPU that is not there would wait forever)."""
from __future__ import annotations

from typing import Callable

from ..errors import UsageError
from ..gpus import parse_query_csv, query_argv
from ..inventory.model import Target
from ..transports.base import Transport
from ..transports.timeouts import PROBE_TIMEOUT_S


def target_gpu_count(transport: Callable[[], Transport], target: Target) -> int | None:
    """The target's GPUs: the inventory's count, else nvidia-smi's (0 where there is none); None when
    nvidia-smi is there but fails (then nothing is refused for it). The target is connected to only to ask."""
    if target.gpus:
        return target.gpus
    result = transport().run(query_argv(("index",)), timeout=PROBE_TIMEOUT_S)
    if result.program_missing:
        return 0
    return len(parse_query_csv(result.out, ("index",))) if result.ok else None


def check_gpus(transport: Callable[[], Transport], target: Target, *, gpus: list[int] | None,
               gpu_count: int | None) -> None:
    """A UsageError for a GPU index the target does not have, or more GPUs than it has; nothing is asked of the
    target when the launch names no GPU."""
    if not gpus and gpu_count is None:
        return
    have = target_gpu_count(transport, target)
    if have is None:
        return
    if gpus and any(g >= have for g in gpus):
        shown = ",".join(map(str, gpus[:8])) + (",..." if len(gpus) > 8 else "")
        raise UsageError(f"--gpus {shown}: {target.name} has {_gpus_had(target, have)}")
    if gpu_count is not None and gpu_count > have:
        raise UsageError(f"--gpu-count {gpu_count}: {target.name} has {_gpus_had(target, have)}")


def _gpus_had(target: Target, have: int) -> str:
    """How many GPUs the target has, and where that was read: `8 GPU(s) (0-7) in the inventory`."""
    where = "in the inventory" if target.gpus else "that nvidia-smi lists (the inventory gives no `gpus:`)"
    return f"{have} GPU(s) (0-{have - 1}) {where}" if have else f"no GPU {where}"
