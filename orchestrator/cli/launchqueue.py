"""`launch --queue` and `--gpu-count N`: what they may be, and what a launch says of a run that waits.

A queued run waits in its container's queue (the agent keeps it, and starts it when its GPUs are free, with no
dflashctl running); the launch returns at once with its place, never waiting for it to start.
"""
from __future__ import annotations

import typer

from dflash_records.protocol import MAX_GPU_INDEX
from dflash_records.run import RunRecord

from ..display import record_state_text, waiting_for
from ..errors import UsageError, shorten

MAX_GPU_COUNT = MAX_GPU_INDEX + 1


QUEUE_OPTION = typer.Option(
    None, "--queue/--no-queue",
    help="When the GPUs the run needs are held (by a live run, or by a process nvidia-smi shows on them), wait "
         "in the container's queue and start, first in first out, once they are free, with no dflashctl running; "
         "the launch returns at once. Default: the inventory's `queue:` (container, host, defaults), else no.")
GPU_COUNT_OPTION = typer.Option(
    None, "--gpu-count", metavar="N",
    help="Any N free GPUs of the target, chosen by its queue when the run starts (implies --queue; --gpus names "
         "GPUs instead).")


def queue_options(*, gpus: list[int] | None, gpu_count: int | None, queue: bool | None, force: bool,
                  job: bool) -> dict:
    """--queue and --gpu-count as launch_spec takes them, refused before anything is contacted where they may not
    be: at least one GPU (a run that uses none says `--gpus none`), not beside --gpus, --force, or a job's several
    targets."""
    if gpu_count is not None and not 1 <= gpu_count <= MAX_GPU_COUNT:
        raise UsageError(f"--gpu-count {shorten(str(gpu_count), 20)}: give a number of GPUs from 1 to "
                         f"{MAX_GPU_COUNT} (--gpus none is a run that uses no GPU)")
    if gpus is not None and gpu_count is not None:
        raise UsageError("give either --gpus (which GPUs) or --gpu-count (how many, any free ones), not both")
    if queue is False and gpu_count is not None:
        raise UsageError("--gpu-count takes its GPUs through the container's queue: not with --no-queue (--gpus "
                         "names GPUs to start on now)")
    if force and (queue or gpu_count is not None):
        raise UsageError(f"{'--queue' if queue else '--gpu-count'} waits for free GPUs, --force starts on GPUs a "
                         f"run holds: give one of them")
    if job and (queue or gpu_count is not None):
        raise UsageError("a job across several targets starts all its nodes at once: --queue and --gpu-count "
                         "take one TARGET (or --each)")
    return {"queue": queue, "gpu_count": gpu_count}


def check_gpu_count(target_name: str, target_gpus: int, gpu_count: int | None) -> None:
    """More GPUs than the inventory gives the target (nvidia-smi's count is the run client's to check)."""
    if gpu_count is not None and target_gpus and gpu_count > target_gpus:
        raise UsageError(f"--gpu-count {gpu_count}: {target_name} has {target_gpus} GPU(s) (0-{target_gpus - 1}) "
                         f"in the inventory")


def queued_line(record: RunRecord, where: str) -> str:
    """`RUN is queued (2nd) on pve1/200, waiting for GPU 1; ...`: its place, what it waits for, what to do."""
    run_id = record.run_id
    return (f"{run_id} is {record_state_text(record)} on {where}, waiting for "
            f"{waiting_for(record.gpus, record.gpu_count)}; it starts by itself when its turn comes, with no "
            f"dflashctl running (`dflashctl ps --queue {where}` shows the queue, `dflashctl kill {run_id}` takes it "
            f"out)")
