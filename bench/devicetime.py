"""Wall times of a function on a device: one untimed call first, the device drained before and after each timed
one (a CUDA call returns before its kernels finish)."""
from __future__ import annotations

import time

import torch


def timings(fn, device: torch.device, repeat: int) -> list[float]:
    """Seconds of each of `repeat` calls of fn() after a warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - began)
    return times
