"""A container's GPU queue as the agent reports it: what placement (`launch --anywhere`) and `ps --queue` read.

A queued run waits in its container's queue (the agent keeps it in SQLite beside the runs) until the GPUs it needs
are free: not held by a live run of ours, nor by a process no run owns (nvidia-smi shows its memory on the GPU).
Runs leave a queue first in, first out; a run waits for every run ahead of it, so a wide run is never starved by
narrow ones queued after it (placement packs narrow runs where GPUs are partly used instead).
"""
from __future__ import annotations

from dataclasses import dataclass

from .answers import FAILURE
from .wire import WireRecord, each, extra_keys


@dataclass(frozen=True)
class QueuedRun(WireRecord):
    """One run in a queue: its place (1: the next to start), what it waits for (`gpus` named, or any
    `gpu_count`), when it was queued, and its sweep where it has one."""

    SKIP_NONE = ("gpus", "gpu_count", "sweep_id")

    run_id: str = ""
    position: int = 0
    name: str | None = None
    gpus: tuple | None = each(optional=True)
    gpu_count: int | None = None
    queued_at: str | None = None
    sweep_id: str | None = None
    extra: dict = extra_keys()


@dataclass(frozen=True)
class QueueAnswer(WireRecord):
    """queue: the container's GPUs (how many; which are free now; which a live run of ours holds; which a process
    no run owns holds) and its queued runs in order. `gpus_total` is None where nvidia-smi could not be read
    (`gpu_error` says why): such a container takes no run that needs GPUs. `resumes_at_boot`: a reboot of the
    container resumes the queue by itself (systemd booted it and the agent's boot unit is in place, or can be put
    there when a run is queued); False: it resumes at the next agent call (and from an agent before the field)."""

    SKIP_NONE = FAILURE + ("gpu_error",)

    ok: bool = False
    gpus_total: int | None = None
    gpus_free: tuple = each()
    gpus_ours: tuple = each()
    gpus_foreign: tuple = each()
    gpu_error: str | None = None
    queued: tuple = each(QueuedRun)
    resumes_at_boot: bool = False
    error: str | None = None
    code: str | None = None
    extra: dict = extra_keys()


def ordinal(position: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, 21st: a queued run's place as ps and the dashboard say it."""
    if 10 <= position % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
    return "{}{}".format(position, suffix)
