"""Tiny models the trainer's tests share across its rooms (and the benchmarks' tests): the devices to run on, a tiny
target written once per session, and drafters made on it."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory):
    from trainer.model.tiny_target import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir, device):
    from trainer.model.target import TargetModel

    # fp32 on every device so that comparisons between code paths are tight
    return TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device=device, dtype=torch.float32)


# a tiny DFlash2 drafter's convolution and selector (the tiny target's hidden size is 64)
TINY_DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def make_drafter(target, *, num_layers: int = 2, block_size: int = 8, sliding_window: int | None = None,
                 layer_types: list[str] | None = None, seed: int = 0, architecture: str = "dflash"):
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.planning.dflash2 import Dflash2Sizes

    config = DrafterConfig.from_target(
        target.config, num_layers=num_layers, block_size=block_size, target_layer_ids=target.layer_ids,
        mask_token_id=target.mask_token_id, sliding_window=sliding_window, layer_types=layer_types,
        dflash2=Dflash2Sizes(**TINY_DFLASH2) if architecture == "dflash2" else None)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    return drafter.to(target.device)


def random_ids(target, shape, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # below the special tokens' range is not needed: any id is a valid input
    return torch.randint(0, target.config.vocab_size, shape, generator=generator).to(target.device)
