"""Process-group set-up behind two functions, as torchrun starts us: one process per GPU (or CPU process).

Under torchrun (RANK/WORLD_SIZE/LOCAL_RANK in the environment) the group uses NCCL on GPUs and gloo on the
CPU; without torchrun everything runs in this one process and no group is created.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.errors import TrainerError


@dataclass
class DistributedContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if requested == "auto":
        return torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise TrainerError(f"device {requested!r} asked for, but CUDA is not available here")
    return torch.device(requested)


def compute_init(requested_device: str = "auto") -> DistributedContext:
    """Join the torchrun process group if there is one and pick this rank's device."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = _pick_device(requested_device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def compute_cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistributedContext) -> None:
    if ctx.is_distributed:
        dist.barrier()


def broadcast_parameters(module: torch.nn.Module, ctx: DistributedContext) -> None:
    """Start every rank from rank 0's weights (same seed already gives the same init; this makes it certain)."""
    if not ctx.is_distributed:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def all_reduce_sum(value: float, ctx: DistributedContext) -> float:
    if not ctx.is_distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return tensor.item()


def weights_digest(module: torch.nn.Module) -> str:
    """A short hash of every trainable weight: ranks that stay in sync print the same digest."""
    digest = hashlib.sha256()
    for name, param in sorted(module.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
