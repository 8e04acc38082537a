"""The training mask, checked on its own and through the real drafter forward."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.model.masks import SLIDING_ATTENTION, block_mask_mod, dense_mask

BLOCK = 4


def _expected_mask(anchors, context_len, block_size, window=None):
    """The rule written out with plain loops, independent of the mask_mod."""
    batch, blocks = anchors.shape
    q_len, kv_len = blocks * block_size, context_len + blocks * block_size
    out = torch.zeros(batch, 1, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for blk in range(blocks):
            anchor = int(anchors[b, blk])
            if anchor < 0:
                continue
            for k in range(block_size):
                q = blk * block_size + k
                lo = 0 if window is None else anchor + k - (window - 1)
                for kv in range(max(lo, 0), min(anchor, context_len)):
                    out[b, 0, q, kv] = True
                for j in range(block_size if window is None else k + 1):
                    out[b, 0, q, context_len + blk * block_size + j] = True
    return out


@pytest.mark.parametrize("window", [None, 3])
def test_dense_mask_follows_the_rule(window):
    anchors = torch.tensor([[0, 5, 9], [7, -1, -1]])
    mask_mod = block_mask_mod(anchors, context_len=12, block_size=BLOCK, window=window)
    dense = dense_mask(mask_mod, 2, 3 * BLOCK, 12 + 3 * BLOCK, device="cpu")
    assert torch.equal(dense, _expected_mask(anchors, 12, BLOCK, window))


@pytest.mark.parametrize("window", [None, 3])
def test_block_mask_and_dense_mask_come_from_the_same_mask_mod(window):
    from torch.nn.attention.flex_attention import create_mask

    anchors = torch.tensor([[2, 6, 11], [7, -1, -1]])
    mask_mod = block_mask_mod(anchors, context_len=13, block_size=BLOCK, window=window)
    vmapped = create_mask(mask_mod, 2, 1, 3 * BLOCK, 13 + 3 * BLOCK, device="cpu")
    assert torch.equal(vmapped, dense_mask(mask_mod, 2, 3 * BLOCK, 13 + 3 * BLOCK, device="cpu"))


def _forward(drafter, features, tokens, anchors, backend=None):
    with torch.no_grad():
        return drafter(features, tokens, anchors, backend=backend)


def _setup(target, *, sliding_window=None, layer_types=None, num_layers=2):
    drafter = make_drafter(target, num_layers=num_layers, block_size=BLOCK, sliding_window=sliding_window,
                           layer_types=layer_types).eval()
    ids = random_ids(target, (1, 24), seed=1)
    features = target.features(ids)
    anchors = torch.tensor([[3, 9, 15]], device=target.device)
    tokens = ids.gather(1, anchors)
    return drafter, features, tokens, anchors


def _changed(before, after):
    return (before - after).abs().amax().item()


def test_full_attention_block_sees_only_context_before_its_anchor(tiny_target):
    drafter, features, tokens, anchors = _setup(tiny_target)
    base = _forward(drafter, features, tokens, anchors)
    anchor = int(anchors[0, 1])
    for pos in range(features.shape[1]):
        bumped = features.clone()
        bumped[0, pos] += 1.0
        diff = _changed(base[0, 1], _forward(drafter, bumped, tokens, anchors)[0, 1])
        if pos < anchor:
            assert diff > 1e-4, f"context position {pos} before anchor {anchor} must matter"
        else:
            assert diff == 0.0, f"context position {pos} at/after anchor {anchor} leaked ({diff})"


def test_blocks_do_not_see_each_other(tiny_target):
    drafter, features, tokens, anchors = _setup(tiny_target)
    base = _forward(drafter, features, tokens, anchors)
    other_tokens = tokens.clone()
    other_tokens[0, 0] = (tokens[0, 0] + 1) % tiny_target.config.vocab_size
    other_tokens[0, 2] = (tokens[0, 2] + 1) % tiny_target.config.vocab_size
    moved = anchors.clone()
    moved[0, 2] = 17
    after = _forward(drafter, features, other_tokens, moved)
    assert _changed(base[0, 1], after[0, 1]) == 0.0
    assert _changed(base[0, 0], after[0, 0]) > 1e-4   # a block's own anchor token does matter


def test_padded_blocks_change_nothing_and_stay_finite(tiny_target):
    drafter, features, tokens, anchors = _setup(tiny_target)
    base = _forward(drafter, features, tokens, anchors)
    padded_anchors = torch.cat([anchors, torch.tensor([[-1]], device=anchors.device)], dim=1)
    padded_tokens = torch.cat([tokens, tokens[:, :1]], dim=1)
    out = _forward(drafter, features, padded_tokens, padded_anchors)
    torch.testing.assert_close(out[:, :3], base, rtol=0, atol=1e-6)
    assert torch.isfinite(out).all()


def _bump_slot_hook(block: int, slot: int):
    def hook(module, args, output):
        output = output.clone()
        output[0, block * BLOCK + slot] += 1.0
        return output
    return hook


def test_sliding_layer_respects_the_window_per_slot(tiny_target):
    window = 3
    drafter, features, tokens, anchors = _setup(
        tiny_target, sliding_window=window, layer_types=[SLIDING_ATTENTION], num_layers=1)
    base = _forward(drafter, features, tokens, anchors)
    anchor = int(anchors[0, 1])
    for pos in range(anchor + 2):
        bumped = features.clone()
        bumped[0, pos] += 1.0
        after = _forward(drafter, bumped, tokens, anchors)
        for k in range(BLOCK):
            diff = _changed(base[0, 1, k], after[0, 1, k])
            if anchor + k - (window - 1) <= pos < anchor:
                assert diff > 1e-4, f"slot {k}: position {pos} is inside the window"
            else:
                assert diff == 0.0, f"slot {k}: position {pos} is outside the window ({diff})"


@pytest.mark.parametrize("sliding, later_slots_only", [(True, True), (False, False)])
def test_inside_a_block_sliding_layers_are_causal_full_layers_bidirectional(
        tiny_target, sliding, later_slots_only):
    drafter, features, tokens, anchors = _setup(
        tiny_target, sliding_window=8 if sliding else None,
        layer_types=[SLIDING_ATTENTION] if sliding else None, num_layers=1)
    base = _forward(drafter, features, tokens, anchors)
    hook = drafter.layers[0].input_layernorm.register_forward_hook(_bump_slot_hook(block=1, slot=2))
    try:
        after = _forward(drafter, features, tokens, anchors)
    finally:
        hook.remove()
    for k in range(BLOCK):
        diff = _changed(base[0, 1, k], after[0, 1, k])
        assert (diff > 1e-4) == (k >= 2 or not later_slots_only), f"slot {k}: {diff}"
    assert _changed(base[0, 0], after[0, 0]) == 0.0 and _changed(base[0, 2], after[0, 2]) == 0.0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_and_dense_sdpa_give_the_same_outputs(tiny_target):
    drafter, features, tokens, anchors = _setup(tiny_target, sliding_window=5)
    dense = _forward(drafter, features, tokens, anchors, backend="sdpa")
    flex = _forward(drafter, features, tokens, anchors, backend="flex")
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- closed-form tiles

def _random_layout(seed: int):
    """Anchors as the objective draws them: sorted, unique, inside the context, -1 padding at the end; plus a
    block size, a context length and maybe a window. Sizes cross several 128-wide tiles."""
    gen = torch.Generator().manual_seed(seed)
    pick = lambda *options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa: E731
    block_size = pick(16, 10, 4, 2)
    context_len = pick(1, 127, 128, 129, 300, 640, 777)
    num_blocks = pick(1, 7, 8, 9, 33, 60)
    window = pick(None, None, 2, 50, 200, 2048)
    batch = pick(1, 2, 3)
    anchors = torch.full((batch, num_blocks), -1, dtype=torch.long)
    for b in range(batch):
        real = int(torch.randint(0, num_blocks + 1, (1,), generator=gen))  # 0: a sequence with no anchor
        if b == 0:
            real = max(real, 1)
        chosen = torch.randperm(context_len, generator=gen)[:real].sort().values
        anchors[b, :len(chosen)] = chosen
    return anchors, block_size, context_len, window


def _tiles_as_elements(tiles, dense):
    """What the kernel computes from the tiles: full tiles all true, partial tiles the mask_mod, others nothing."""
    from trainer.model.masks import TILE

    q_len, kv_len = dense.shape[-2:]
    grow = lambda t: t.repeat_interleave(TILE, 1).repeat_interleave(TILE, 2)[:, :q_len, :kv_len]  # noqa: E731
    return grow(tiles.full) | (grow(tiles.partial) & dense[:, 0])


@pytest.mark.parametrize("seed", range(60))
def test_closed_form_tiles_give_exactly_the_mask_mod(seed):
    from trainer.model.masks import mask_tiles

    anchors, block_size, context_len, window = _random_layout(seed)
    mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
    q_len = anchors.shape[1] * block_size
    dense = dense_mask(mask_mod, anchors.shape[0], q_len, context_len + q_len, device="cpu")
    tiles = mask_tiles(anchors, context_len=context_len, block_size=block_size, window=window)
    assert not (tiles.full & tiles.partial).any()
    assert torch.equal(_tiles_as_elements(tiles, dense), dense[:, 0])


@pytest.mark.parametrize("window", [None, 256])
def test_closed_form_tiles_skip_what_no_row_sees(window):
    """Sparsity is the point: at a real size most tiles are skipped, and the context before every anchor of a
    query tile is full (no mask_mod evaluated there)."""
    from trainer.model.masks import mask_tiles

    context_len, block_size = 3072, 16
    anchors = torch.arange(100, 3072, 16)[None, :192]
    tiles = mask_tiles(anchors, context_len=context_len, block_size=block_size, window=window)
    skipped = 1 - (tiles.full | tiles.partial).float().mean().item()
    assert skipped > 0.4
    if window is None:  # a whole query tile (8 blocks) sees all of every context tile before its first anchor
        for q_tile in range(anchors.shape[1] // 8):
            assert int(tiles.full[0, q_tile].sum()) == int(anchors[0, 8 * q_tile]) // 128


def test_closed_form_block_mask_holds_the_tiles():
    from trainer.model.masks import closed_form_block_mask, mask_tiles

    anchors, block_size, context_len, window = torch.tensor([[5, 130, 400, -1]]), 16, 520, None
    mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
    block_mask = closed_form_block_mask(anchors, mask_mod, context_len=context_len, block_size=block_size)
    tiles = mask_tiles(anchors, context_len=context_len, block_size=block_size)
    assert block_mask.shape == (1, 1, 4 * block_size, context_len + 4 * block_size)
    assert torch.equal(block_mask.to_dense()[:, 0].bool(), tiles.full | tiles.partial)
    assert torch.equal(block_mask.full_kv_num_blocks[:, 0], tiles.full.sum(-1).int())
