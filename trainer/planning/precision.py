"""Where `target_precision: fp8` can run: a GPU with FP8 matrix cores (compute capability 8.9 or above: Ada,
Hopper and later). Checked by `trainer check` and before a run loads anything; torch is imported only to ask
the GPU, so the controller can read this module without it."""
from __future__ import annotations

FP8_MIN_CAPABILITY = (8, 9)


def local_gpu(device: str) -> tuple[str, tuple[int, int]] | None:
    """(name, compute capability) of the GPU a run with this `device` setting would use here; None for the CPU
    or a machine without CUDA."""
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    return torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))


def fp8_refusal(gpu: tuple[str, tuple[int, int]] | None) -> str | None:
    """Why fp8 cannot run on `gpu` (local_gpu's answer), in one line; None when it can."""
    if gpu is None:
        return ("target_precision: fp8 needs a GPU with FP8 matrix cores (compute capability 8.9 or above: Ada, "
                "Hopper), and this run would be on the CPU; use target_precision: bf16")
    name, capability = gpu
    if tuple(capability) < FP8_MIN_CAPABILITY:
        have = ".".join(map(str, capability))
        return (f"target_precision: fp8 needs a GPU with FP8 matrix cores (compute capability 8.9 or above: Ada, "
                f"Hopper); {name} has {have}; use target_precision: bf16")
    return None
