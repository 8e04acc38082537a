"""The drafter a run trains, the same on every rank: loaded from its checkpoint, or built new from the target
family's recipe with the config's drafter_* keys over it (and DFlash2's sizes checked against the target), then
described in one start-up line."""
from __future__ import annotations

from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.training.metrics import MetricsLog


def build_drafter(cfg: TrainConfig, ctx, log: MetricsLog, target, checkpoint: Path | None):
    """The drafter in fp32 on the device, the same on every rank: from `checkpoint`, or new from the target
    family's recipe with the config's drafter_* keys over it."""
    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.drafter_files import load_drafter
    from trainer.planning.target_families import drafter_shape
    from trainer.training.distributed import broadcast_parameters

    torch.manual_seed(cfg.seed)  # same init on every rank; the broadcast below makes it certain
    if checkpoint is not None:
        drafter = load_drafter(checkpoint, embed_tokens=target.embed_tokens, lm_head=target.lm_head,
                               device=ctx.device)
    else:  # a fresh run, or a rank on another node that gets rank 0's checkpointed weights by broadcast
        shape = drafter_shape(target.spec, heads=cfg.drafter_heads, kv_heads=cfg.drafter_kv_heads,
                              head_dim=cfg.drafter_head_dim, intermediate_size=cfg.drafter_intermediate_size,
                              sliding_window=cfg.sliding_window, rope_theta=cfg.drafter_rope_theta)
        drafter_config = DrafterConfig.from_target(
            target.config, num_layers=cfg.drafter_layers, block_size=cfg.block_size,
            target_layer_ids=cfg.target_layer_ids, mask_token_id=target.mask_token_id, shape=shape,
            dflash2=dflash2_sizes(cfg, target.config))
        with torch.device(ctx.device):  # initialised where it trains: an 8B-shape drafter took 15 s on the CPU
            drafter = DFlashDrafter(drafter_config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    drafter = drafter.to(device=ctx.device, dtype=torch.float32)  # fp32 master weights; autocast computes in bf16
    broadcast_parameters(drafter, ctx)
    n_params = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    shown = drafter.config
    window = f", sliding window {shown.sliding_window} on {len(shown.layer_types) - 1}" if shown.sliding_window else ""
    sizes = shown.dflash2
    dflash2 = (f", DFlash2: block {shown.block_size}, convolution of {sizes.conv_kernel_size} taps by groups of "
               f"{sizes.conv_group_size}, selector of rank {sizes.selector_rank} over the top {sizes.selector_top_k}"
               if sizes else "")
    log.say(f"Drafter: {cfg.drafter_layers} layers, {n_params / 1e6:.2f}M trainable parameters, "
            f"{shown.num_attention_heads} heads / {shown.num_key_value_heads} KV x {shown.head_dim}, MLP "
            f"{shown.intermediate_size}{window}, mask token {shown.mask_token_id}, taps {cfg.target_layer_ids}"
            f"{dflash2}")
    return drafter


def dflash2_sizes(cfg: TrainConfig, target_config):
    """A dflash2 run's convolution and selector sizes (None for dflash); a TrainerError where they cannot fit."""
    from trainer.planning.dflash2 import Dflash2Sizes

    if cfg.architecture != "dflash2":
        return None
    sizes = Dflash2Sizes.from_mapping(cfg)
    problems = sizes.problems(hidden_size=target_config.hidden_size, vocab_size=target_config.vocab_size)
    if problems:
        raise TrainerError("; ".join(message for _, message in problems))
    return sizes
