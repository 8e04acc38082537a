"""The optimizer module in one process: a ZeRO rank (rank 0 of 2, on a fake process group whose collectives do
nothing) resumes its share of a whole fused AdamW state and steps exactly as AdamW does on that share."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from trainer.planning.memory_plan import zero_partition
from trainer.training import optim

SHAPES = [(6, 5), (7,), (4, 4), (3,), (9, 2)]


def set_grads(params: list[torch.nn.Parameter], step: int) -> None:
    for i, param in enumerate(params):
        param.grad = torch.linspace(-1, 1, param.numel()).view_as(param) * (i + 1) * (step + 1)


def test_a_zero_rank_resumes_its_share_of_a_whole_fused_adamw_state():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cfg = SimpleNamespace(lr=1e-2, weight_decay=0.1, simulate_shards=0, shard_optimizer=True)
    torch.manual_seed(0)
    whole_params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    whole, line = optim.build_optimizer(whole_params, cfg, SimpleNamespace(world_size=1, rank=0), fused=True)
    assert line.startswith("Optimizer: AdamW, states whole")
    set_grads(whole_params, 0)
    whole.step()
    checkpoint = copy.deepcopy(whole.state_dict())
    resumed_from = [p.detach().clone() for p in whole_params]
    set_grads(whole_params, 1)
    whole.step()

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        params = [torch.nn.Parameter(value.clone()) for value in resumed_from]
        zero, line = optim.build_optimizer(params, cfg, SimpleNamespace(world_size=2, rank=0), fused=True)
        optim.load_state(zero, copy.deepcopy(checkpoint))
        set_grads(params, 1)
        zero.step()
    finally:
        dist.destroy_process_group()
    assert line.startswith("Optimizer: AdamW, states sharded 2 ways (ZeRO-1): rank 0 keeps")
    share = set(zero_partition([p.numel() for p in params], 2)[0])
    assert 0 < len(share) < len(params)
    for i, param in enumerate(params):
        expected = whole_params[i] if i in share else resumed_from[i]   # the other rank's share is not ours
        assert torch.equal(param, expected), i
    kept = zero.optim.state
    assert {id(p) for p in kept} == {id(params[i]) for i in share}
    for param, state in kept.items():   # where a fused AdamW keeps its step counters: on the parameter's device
        assert state["step"].device == param.device and state["step"].dtype == torch.float32
        assert float(state["step"]) == 2


def test_a_simulated_runs_partial_state_is_refused_by_a_whole_optimizer():
    import pytest

    from trainer.errors import TrainerError

    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    cfg = SimpleNamespace(lr=1e-2, weight_decay=0.0, simulate_shards=3, shard_optimizer="auto")
    simulated, _ = optim.build_optimizer(params, cfg, SimpleNamespace(world_size=1, rank=0), fused=False)
    set_grads(params, 0)
    simulated.step()
    whole, _ = optim.build_optimizer(params, SimpleNamespace(**{**vars(cfg), "simulate_shards": 0}),
                                     SimpleNamespace(world_size=1), fused=False)
    with pytest.raises(TrainerError, match=r"optimizer state is of \d parameters, this run optimizes 5: a "
                                           r"simulate_shards run's checkpoint"):
        optim.load_state(whole, simulated.state_dict())
    resumed, _ = optim.build_optimizer(params, cfg, SimpleNamespace(world_size=1, rank=0), fused=False)
    optim.load_state(resumed, simulated.state_dict())   # the same simulation resumes its own state
    assert len(resumed.state) == len(simulated.state) > 0
