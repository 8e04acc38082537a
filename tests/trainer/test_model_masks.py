"""The training mask, checked on its own and through the real drafter forward."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.test_model_support import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.masks import SLIDING_ATTENTION, block_mask_mod, dense_mask

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
