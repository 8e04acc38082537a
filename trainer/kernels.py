"""Fused kernels for the drafter's elementwise work, from liger-kernel where it runs (a CUDA device and Triton),
the drafter's own torch code everywhere else.

The drafter (trainer/drafter.py) stays plain torch, so its module can be shipped and read as it is; `install`
swaps the forward of its RMSNorm and MLP modules in place for liger's fused Triton kernels (RMSNorm in one pass,
SiLU(gate) * up in one pass), each computing in fp32 and returning the input's dtype as the torch code does.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import types
from typing import Literal

import torch
from torch import nn

from trainer.errors import TrainerError

KernelChoice = Literal["auto", "torch", "liger"]


def liger_version() -> str | None:
    """The installed liger-kernel's version, None when it is absent or cannot be imported."""
    try:
        if importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("triton") is None:
            return None
        return importlib.metadata.version("liger-kernel")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def resolve(choice: KernelChoice, device: torch.device) -> str:
    """"liger" or "torch" for a run on `device`: auto takes liger where it can run; an explicit liger that cannot
    is refused in one line before anything loads."""
    usable = device.type == "cuda" and liger_version() is not None
    if choice == "liger" and not usable:
        reason = "it is not installed (pip install 'dflashctl[fast]')" if liger_version() is None else \
            f"its Triton kernels need a CUDA device, not {device.type}"
        raise TrainerError(f"kernels: liger was asked for, but {reason}; use kernels: auto or torch")
    if choice == "torch":
        return "torch"
    return "liger" if usable else "torch"


def _liger_rms_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # under autocast the master weight is fp32 and x bf16: the kernel normalises in fp32 and writes x's dtype
    return LigerRMSNormFunction.apply(x, module.weight, module.eps, 0.0, "llama", False)


def _liger_mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return module.down_proj(LigerSiLUMulFunction.apply(module.gate_proj(x), module.up_proj(x)))


def install(drafter: nn.Module, kernels: str) -> str:
    """Bind the chosen kernels to the drafter's modules; returns what the start-up line says of them."""
    from trainer.drafter import DrafterMLP, RMSNorm

    if kernels == "torch":   # the modules' own forward again (it may have been swapped before)
        for module in drafter.modules():
            if isinstance(module, (RMSNorm, DrafterMLP)):
                module.__dict__.pop("forward", None)
        return "drafter RMSNorm and SwiGLU: torch"
    for module in drafter.modules():
        if isinstance(module, RMSNorm):
            module.forward = types.MethodType(_liger_rms_norm, module)
        elif isinstance(module, DrafterMLP):
            module.forward = types.MethodType(_liger_mlp, module)
    return f"drafter RMSNorm and SwiGLU: liger-kernel {liger_version()}"
