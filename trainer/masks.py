"""The drafter's attention mask: one mask_mod, used as a flex_attention BlockMask or as a dense boolean mask.

Queries are the block tokens, laid out block after block ([A blocks x B slots] per sequence); keys/values are
[context positions 0..S-1 | the same block tokens]. A block whose anchor is negative is padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def block_mask_mod(anchors: torch.Tensor, *, context_len: int, block_size: int,
                   window: int | None = None) -> MaskMod:
    """mask_mod(b, h, q_idx, kv_idx) -> bool for anchors [batch, num_blocks] (-1 marks a padded block).

    Full-attention layers: a block sees context positions kv < anchor and all of its own slots.
    Sliding layers (window W): slot k sees context [anchor + k - (W-1), anchor) and its own slots <= k.
    Blocks never see each other; padded blocks see nothing.
    """
    last_block = anchors.shape[1] - 1

    def mask_mod(b, h, q_idx, kv_idx):
        # clamped so that kernels evaluating padded query rows never index past the anchors
        q_block = torch.clamp(q_idx // block_size, max=last_block)
        q_slot = q_idx % block_size
        anchor = anchors[b, q_block]
        in_context = kv_idx < context_len
        kv_rel = kv_idx - context_len
        same_block = (kv_rel >= 0) & (kv_rel // block_size == q_idx // block_size)
        context_ok = kv_idx < anchor
        if window is not None:
            context_ok = context_ok & (kv_idx >= anchor + q_slot - (window - 1))
            same_block = same_block & (kv_rel % block_size <= q_slot)
        return (anchor >= 0) & torch.where(in_context, context_ok, same_block)

    return mask_mod


@dataclass
class DrafterMask:
    """The masks of one forward pass, built once and shared by every layer of the same type."""

    backend: str                       # "flex" or "sdpa"
    masks: dict[str, object]           # layer type -> BlockMask (flex) or bool [batch, 1, Q, KV] (sdpa)

    def attend(self, layer_type: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               *, scale: float) -> torch.Tensor:
        mask = self.masks[layer_type]
        if self.backend == "flex":
            attention = flex_functions(query.device)[1]
            return attention(query, key, value, block_mask=mask, scale=scale, enable_gqa=True)
        # fully masked rows (padded blocks) come out as zeros, as with flex_attention
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=True)


def choose_backend(device: torch.device, requested: str = "auto") -> str:
    """flex_attention needs a GPU for its backward pass; the CPU uses SDPA with the same mask as a dense tensor."""
    if requested not in ("auto", "flex", "sdpa"):
        raise ValueError(f"unknown attention backend {requested!r}")
    if requested == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return requested


def build_drafter_mask(anchors: torch.Tensor, *, context_len: int, block_size: int, layer_types: list[str],
                       sliding_window: int | None, backend: str) -> DrafterMask:
    batch, num_blocks = anchors.shape
    q_len, kv_len = num_blocks * block_size, context_len + num_blocks * block_size
    masks: dict[str, object] = {}
    for layer_type in sorted(set(layer_types)):
        window = sliding_window if layer_type == SLIDING_ATTENTION else None
        mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
        if backend == "flex":
            create = flex_functions(anchors.device)[0]
            masks[layer_type] = create(mask_mod, batch, None, q_len, kv_len, device=anchors.device)
        else:
            masks[layer_type] = dense_mask(mask_mod, batch, q_len, kv_len, device=anchors.device)
    return DrafterMask(backend=backend, masks=masks)


def dense_mask(mask_mod: MaskMod, batch: int, q_len: int, kv_len: int, *, device) -> torch.Tensor:
    """[batch, 1, q_len, kv_len] bool, evaluated from the mask_mod by broadcasting (no vmap)."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q_idx = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
    kv_idx = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
    return mask_mod(b, h, q_idx, kv_idx).expand(batch, 1, q_len, kv_len)


_FLEX_FUNCTIONS: dict[str, tuple] = {}


def flex_functions(device: torch.device) -> tuple:
    """(create_block_mask, flex_attention) for a device, compiled once per process on CUDA.

    Uncompiled flex_attention materialises the whole score matrix and has no CPU backward; on the CPU it only
    serves tests that compare it with the dense path."""
    if device.type not in _FLEX_FUNCTIONS:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if device.type == "cuda":
            # (issue 6: try dynamic=True for the mask builder, fewer recompiles; not yet measured on a GPU)
            create_block_mask = torch.compile(create_block_mask)
            # dynamic=None: the first new shape recompiles as dynamic, later shapes reuse that graph
            flex_attention = torch.compile(flex_attention, dynamic=None)
        _FLEX_FUNCTIONS[device.type] = (create_block_mask, flex_attention)
    return _FLEX_FUNCTIONS[device.type]
