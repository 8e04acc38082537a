"""Process-group set-up behind two functions, as torchrun starts us: one process per GPU (or CPU process).

Under torchrun (RANK/WORLD_SIZE/LOCAL_RANK in the environment) the group uses NCCL on GPUs and gloo on the
CPU; without torchrun everything runs in this one process and no group is created.

A collective that waits for a peer which died or became unreachable fails after DFLASH_DIST_TIMEOUT_S seconds
(default 600) instead of hanging for torch's default of up to 30 minutes (gloo) or forever (NCCL without its
watchdog): the rank exits non-zero, torchrun ends the node, and the job ends `failed` on every node.

A multi-node job that restarts its workers (torchrun --max-restarts) runs torchrun with its own rendezvous
store kept apart from the workers' (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): in the shared store a restarted
worker can read the address a dead worker of the previous attempt published and fail to connect (pytorch
#135712). The workers' store then lives in the process torchrun numbered 0, on the node torchrun's MASTER_ADDR
names, whatever global rank DFLASH_RANK_OFFSET gives that process; `worker_store` builds it so.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dflash_records.restart import BACKOFF_ENV, RESTART_COUNT_ENV, worker_backoff
from trainer.errors import TrainerError

TIMEOUT_ENV = "DFLASH_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


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


def collective_timeout() -> datetime.timedelta:
    """How long a collective may wait for the other ranks (DFLASH_DIST_TIMEOUT_S seconds)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise TrainerError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds") from None
    if not 0 < seconds < 10**7:
        raise TrainerError(f"{TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return datetime.timedelta(seconds=seconds)


def restart_backoff_s() -> float:
    """Seconds this worker waits before joining its job again after torchrun restarted the workers (torchrun
    itself restarts at once): the restart policy's backoff, as the supervisor waits between a run's attempts."""
    restarts, base = (os.environ.get(name, "").strip() for name in (RESTART_COUNT_ENV, BACKOFF_ENV))
    try:
        return worker_backoff(restarts, base)
    except ValueError:
        raise TrainerError(f"{BACKOFF_ENV}={base!r} or {RESTART_COUNT_ENV}={restarts!r}: expected numbers") from None


def job_rank(torchrun_rank: int, local_rank: int, world_size: int) -> int:
    """This process's global rank. torchrun's c10d rendezvous orders nodes by address; a multi-node job
    launched by dflashctl fixes the order instead (DFLASH_RANK_OFFSET: the processes of the nodes before
    this one), so that rank 0, which logs and writes checkpoints, is on the job's first node."""
    text = os.environ.get("DFLASH_RANK_OFFSET", "").strip()
    if not text:
        return torchrun_rank
    try:
        rank = int(text) + local_rank
    except ValueError:
        raise TrainerError(f"DFLASH_RANK_OFFSET={text!r}: expected an integer") from None
    if not 0 <= rank < world_size:
        raise TrainerError(f"DFLASH_RANK_OFFSET={text} + local rank {local_rank} is outside the world of "
                           f"{world_size} processes: the nodes' process counts disagree")
    return rank


def worker_store(torchrun_rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """The workers' own TCPStore when torchrun does not share its rendezvous store with them: hosted by the
    process torchrun numbered 0 (MASTER_ADDR is its node), a client everywhere else. None when torchrun shares
    its store (the default), and init_process_group's env:// finds it itself."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() != "false" or \
            "MASTER_ADDR" not in os.environ:
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                         is_master=torchrun_rank == 0, timeout=timeout, multi_tenant=True)


def compute_init(requested_device: str = "auto") -> DistributedContext:
    """Join the torchrun process group if there is one and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torchrun_rank = int(os.environ.get("RANK", 0))
    rank = job_rank(torchrun_rank, local_rank, world_size)
    if "RANK" in os.environ:
        os.environ["RANK"] = str(rank)  # what init_process_group (env://) and anything else reading RANK see
    device = _pick_device(requested_device, local_rank)
    timeout = collective_timeout()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        delay = restart_backoff_s()
        if delay and local_rank == 0:   # each node's log says it (a node restarted for another's loss counts none)
            print(f"restart {os.environ[RESTART_COUNT_ENV]} of the job's workers: waiting {delay:g} s "
                  "before they start again", file=sys.stderr, flush=True)
        time.sleep(delay)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            # the watchdog that turns a timed-out collective into an error (torch's default, made certain)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        store = worker_store(torchrun_rank, world_size, timeout)
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device if device.type == "cuda" else None,
                                **({"store": store, "rank": rank, "world_size": world_size} if store is not None else {}))
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


def rank_share(count: torch.Tensor, ctx: DistributedContext) -> torch.Tensor:
    """The sum of `count` over every rank, divided by the ranks: a loss normalised by it, whose gradients DDP then
    averages, is the whole global batch's loss over its global count, whatever each rank's own count (a rank whose
    batch holds fewer supervised slots no longer weighs each of them more). `count` is a tensor on the device, so
    this enqueues an all-reduce without waiting for the GPU."""
    if not ctx.is_distributed:
        return count
    total = count.detach().clone()
    dist.all_reduce(total)
    return total / ctx.world_size


def weights_digest(module: torch.nn.Module) -> str:
    """A short hash of every trainable weight: ranks that stay in sync print the same digest."""
    digest = hashlib.sha256()
    for name, param in sorted(module.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def broadcast_object(value, ctx: DistributedContext):
    """Rank 0's `value` on every rank (pickled; for small things and for a once-per-run resume state)."""
    if not ctx.is_distributed:
        return value
    box = [value if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """True on every rank when `flag` is true on at least one."""
    return all_reduce_sum(1.0 if flag else 0.0, ctx) > 0
