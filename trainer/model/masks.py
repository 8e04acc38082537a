"""The drafter's attention mask: one mask_mod, used as a flex_attention BlockMask or as a dense boolean mask.

Queries are the block tokens, laid out block after block ([A blocks x B slots] per sequence); keys/values are
[context positions 0..S-1 | the same block tokens]. A block whose anchor is negative is padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# the mask itself lives with the layers in the file every checkpoint ships; the BlockMask machinery stays here
from trainer.model.modeling_dflash import (FULL_ATTENTION, SLIDING_ATTENTION, DenseMask, MaskMod,  # noqa: F401
                                           block_mask_mod, dense_drafter_masks, dense_mask)


class DrafterMask(DenseMask):
    """The masks of one forward pass, built once and shared by every layer of the same type: flex_attention
    BlockMasks, or the dense boolean masks the shipped model uses (backend "sdpa")."""

    def __init__(self, backend: str, masks: dict[str, object]) -> None:
        super().__init__(masks)
        self.backend = backend

    def attend(self, layer_type: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               *, scale: float) -> torch.Tensor:
        if self.backend == "flex":
            return flex_attention_for(query.device)(query, key, value, block_mask=self.masks[layer_type],
                                                    scale=scale, enable_gqa=True)
        return super().attend(layer_type, query, key, value, scale=scale)


def choose_backend(device: torch.device, requested: str = "auto") -> str:
    """flex_attention needs a GPU for its backward pass; the CPU uses SDPA with the same mask as a dense tensor."""
    if requested not in ("auto", "flex", "sdpa"):
        raise ValueError(f"unknown attention backend {requested!r}")
    if requested == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return requested


def build_drafter_mask(anchors: torch.Tensor, *, context_len: int, block_size: int, layer_types: list[str],
                       sliding_window: int | None, backend: str) -> DrafterMask:
    if backend != "flex":
        return DrafterMask("sdpa", dense_drafter_masks(anchors, context_len=context_len, block_size=block_size,
                                                       layer_types=layer_types, sliding_window=sliding_window))
    masks: dict[str, object] = {}
    for layer_type in sorted(set(layer_types)):
        window = sliding_window if layer_type == SLIDING_ATTENTION else None
        mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
        masks[layer_type] = closed_form_block_mask(anchors, mask_mod, context_len=context_len,
                                                   block_size=block_size, window=window)
    return DrafterMask("flex", masks)


# ---------------------------------------------------------------------------------------------- block sparsity

TILE = 128  # flex_attention's sparse block: the mask is described per TILE x TILE tile of [queries, keys]


@dataclass
class MaskTiles:
    """Per sequence, query tile and key tile: `full` tiles attend everywhere (the kernel skips the mask_mod),
    `partial` tiles attend somewhere (the kernel applies the mask_mod), all others are skipped."""

    partial: torch.Tensor  # bool [batch, q_tiles, kv_tiles]
    full: torch.Tensor     # bool [batch, q_tiles, kv_tiles], disjoint from partial


def mask_tiles(anchors: torch.Tensor, *, context_len: int, block_size: int, window: int | None = None,
               tile: int = TILE) -> MaskTiles:
    """The block-sparse layout of block_mask_mod in closed form: a few index operations on the anchors' device,
    nothing compiled and no host sync, whatever the batch shape.

    A query tile holds whole or cut blocks; what it may see is bounded by its real blocks' smallest and largest
    anchor (amin, amax). Context tile [lo, hi) is full when every row sees all of it (hi <= amin, and for a
    sliding window lo at or after the latest row's window start), partial when some row may see some of it.
    Each block sees its own slots in the block part of the keys; blocks never see each other, so those tiles are
    never full. Over-reporting partial tiles only costs time (the mask_mod decides); a full tile is exact.
    """
    batch, num_blocks = anchors.shape
    device = anchors.device
    q_len = num_blocks * block_size
    kv_len = context_len + q_len
    q_tiles, kv_tiles = -(-q_len // tile), -(-kv_len // tile)
    rows = torch.arange(q_tiles * tile, device=device)
    row_block = rows // block_size
    row_anchor = anchors.gather(1, row_block.clamp(max=num_blocks - 1).expand(batch, -1))
    row_anchor = torch.where(row_block < num_blocks, row_anchor, -1).view(batch, q_tiles, tile)
    valid = row_anchor >= 0
    any_valid, all_valid = valid.any(-1, keepdim=True), valid.all(-1, keepdim=True)
    amax = torch.where(valid, row_anchor, -1).amax(-1, keepdim=True)                # [batch, q_tiles, 1]
    amin = torch.where(valid, row_anchor, kv_len).amin(-1, keepdim=True)
    tile_block = row_block.view(q_tiles, tile).expand(batch, -1, -1)
    first_block = torch.where(valid, tile_block, num_blocks).amin(-1, keepdim=True)
    last_block = torch.where(valid, tile_block, -1).amax(-1, keepdim=True)

    lo = torch.arange(kv_tiles, device=device) * tile                              # [kv_tiles]
    hi = lo + tile
    context_partial = any_valid & (lo < context_len) & (lo < amax)
    context_full = all_valid & (hi <= context_len) & (hi <= amin)
    if window is not None:  # row (anchor a, slot k) sees [a + k - (window - 1), a)
        context_partial &= hi > amin - (window - 1)
        context_full &= lo >= amax + block_size - window
    own_lo = context_len + first_block * block_size
    own_hi = context_len + (last_block + 1) * block_size
    own_blocks = any_valid & (hi > own_lo) & (lo < own_hi)
    return MaskTiles(partial=(context_partial | own_blocks) & ~context_full, full=context_full)


def _kv_block_lists(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [batch, q_tiles, kv_tiles] -> (counts [batch, 1, q_tiles], indices [batch, 1, q_tiles, kv_tiles]) as
    BlockMask stores them: each row's set tiles first, in ascending order."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int32), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[:, None], order[:, None]


def closed_form_block_mask(anchors: torch.Tensor, mask_mod: MaskMod, *, context_len: int, block_size: int,
                           window: int | None = None):
    """A flex_attention BlockMask for block_mask_mod, built from mask_tiles rather than by evaluating the
    mask_mod over every tile through a compiled create_block_mask (which compiled anew for each batch shape)."""
    from torch.nn.attention.flex_attention import BlockMask

    tiles = mask_tiles(anchors, context_len=context_len, block_size=block_size, window=window)
    q_len = anchors.shape[1] * block_size
    return BlockMask.from_kv_blocks(*_kv_block_lists(tiles.partial), *_kv_block_lists(tiles.full),
                                    BLOCK_SIZE=TILE, mask_mod=mask_mod, seq_lengths=(q_len, context_len + q_len))


_FLEX_ATTENTION: dict[str, Callable] = {}


def flex_attention_for(device: torch.device) -> Callable:
    """flex_attention for a device, compiled once per process on CUDA. Its first graph is specialised to the
    first shape; the second shape recompiles it with dynamic sizes, which every later shape reuses (but a batch
    of one sequence, or a single 128-wide tile: sizes 1 are specialised). The trainer pays both compiles up
    front (compile_warmup.compile_attention).

    Uncompiled flex_attention materialises the whole score matrix and has no CPU backward; on the CPU it only
    serves tests that compare it with the dense path."""
    if device.type not in _FLEX_ATTENTION:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX_ATTENTION[device.type] = (torch.compile(flex_attention) if device.type == "cuda"
                                        else flex_attention)
    return _FLEX_ATTENTION[device.type]
