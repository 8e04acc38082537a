"""The drafter's optimizer: AdamW, its states sharded across the ranks (ZeRO-1) or whole, and its checkpoint form.

Sharded, every rank still holds the whole drafter and its whole gradient (DDP all-reduces it, so gradient
clipping sees the global norm); each rank keeps AdamW's two fp32 states for its share of the parameters only,
updates that share and broadcasts it (torch's ZeroRedundancyOptimizer). The update of each parameter is the
same arithmetic as the unsharded optimizer's, so both give the same weights.

A checkpoint always holds the whole optimizer state in the layout torch.optim.AdamW.state_dict() writes (ZeRO
gathers it to rank 0 first), so a run resumes sharded or not, whatever the checkpoint was written with.

`simulate_shards: N` on one process keeps only the states rank 0 of N would keep and updates only those
parameters: a check of the per-rank memory on one GPU, not a way to train.
"""
from __future__ import annotations

from itertools import chain

import torch

from trainer.errors import TrainerError
from trainer.planning.memory_plan import sharding_ways, zero_partition

BETAS = (0.9, 0.95)


def build_optimizer(params: list[torch.nn.Parameter], cfg, ctx, *, fused: bool):
    """(optimizer, one start-up line saying how it holds its states)."""
    options = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, betas=BETAS, fused=fused)
    total = sum(p.numel() for p in params)
    if cfg.simulate_shards > 1:
        mine = rank_share(params, cfg.simulate_shards, rank=0)
        kept = sum(p.numel() for p in mine)
        line = (f"Optimizer: AdamW, simulating rank 0 of {cfg.simulate_shards} (memory check): states for "
                f"{_millions(kept)} of {_millions(total)} parameters; the other weights are not updated")
        return torch.optim.AdamW(mine, **options), line
    ways = sharding_ways(cfg.shard_optimizer, ctx.world_size)
    if ways == 1:
        line = f"Optimizer: AdamW, states whole on every rank ({_millions(total)} parameters)"
        return torch.optim.AdamW(params, **options), line
    from torch.distributed.optim import ZeroRedundancyOptimizer

    optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **options)
    kept = sum(p.numel() for group in optimizer.optim.param_groups for p in group["params"])
    return optimizer, (f"Optimizer: AdamW, states sharded {ways} ways (ZeRO-1): rank {ctx.rank} keeps "
                       f"{_millions(kept)} of {_millions(total)} parameters' states")


def rank_share(params: list[torch.nn.Parameter], ways: int, *, rank: int) -> list[torch.nn.Parameter]:
    """The parameters ZeroRedundancyOptimizer would give `rank` of `ways` ranks, in their original order."""
    chosen = set(zero_partition([p.numel() for p in params], ways)[rank])
    return [p for i, p in enumerate(params) if i in chosen]


def _is_zero(optimizer) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def full_state(optimizer, ctx) -> dict | None:
    """The whole optimizer state on rank 0 (None on the others); every rank must call it."""
    if not _is_zero(optimizer):
        return optimizer.state_dict() if ctx.is_main else None
    optimizer.consolidate_state_dict(to=0)  # on CPU at rank 0: the shards pass through each rank's device
    if not ctx.is_main:
        return None
    state = optimizer.state_dict()
    # the gathered shards stay referenced by the optimizer until the next consolidation: a whole fp32 copy of
    # AdamW's states in rank 0's host memory; the returned dict holds them for as long as the caller needs
    optimizer._all_state_dicts = []
    return state


def load_state(optimizer, state: dict) -> None:
    """Load a whole optimizer state (either optimizer's checkpoint layout); a ZeRO rank keeps its share only."""
    saved = sum(len(group["params"]) for group in state["param_groups"])
    mine = sum(len(group["params"]) for group in optimizer.param_groups)
    if saved != mine:
        raise TrainerError(f"the checkpoint's optimizer state is of {saved} parameters, this run optimizes {mine}: "
                           f"a simulate_shards run's checkpoint holds one rank's share only; use --resume never")
    if not _is_zero(optimizer):
        optimizer.load_state_dict(state)
        return
    # Move this rank's share to its device first: ZeroRedundancyOptimizer copies each state to the device twice
    # otherwise (once for its local AdamW, once for its own bookkeeping), a second resident copy of the share.
    params = list(chain.from_iterable(group["params"] for group in optimizer.param_groups))
    local = {p for group in optimizer.optim.param_groups for p in group["params"]}
    moved = dict(state, state={index: _to_device(value, params[index].device) if params[index] in local else value
                               for index, value in state["state"].items()})
    optimizer.load_state_dict(moved)
    _steps_where_adamw_keeps_them(optimizer.optim)


def _to_device(value: dict, device: torch.device) -> dict:
    # AdamW's step counter stays where it was saved; ZeroRedundancyOptimizer puts it on the CPU itself
    return {key: v.to(device) if torch.is_tensor(v) and v.dim() > 0 else v for key, v in value.items()}


def _steps_where_adamw_keeps_them(adamw: torch.optim.Optimizer) -> None:
    """ZeroRedundancyOptimizer loads every step counter onto the CPU; a fused (or capturable) AdamW keeps them
    on the parameter's device, as its own load_state_dict would."""
    for group in adamw.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for param in group["params"]:
            step = adamw.state.get(param, {}).get("step")
            if torch.is_tensor(step):
                adamw.state[param]["step"] = step.to(param.device, dtype=torch.float32)


def _millions(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"
