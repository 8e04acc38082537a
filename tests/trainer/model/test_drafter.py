"""The drafter's config, its shared modules and its greedy draft."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.model.drafter import DrafterConfig


def test_config_follows_the_target(tiny_target):
    config = DrafterConfig.from_target(tiny_target.config, num_layers=3, block_size=16,
                                       target_layer_ids=tiny_target.layer_ids, mask_token_id=7)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        64, 4, 2, 16)
    assert config.rope_theta == tiny_target.config.rope_parameters["rope_theta"]
    assert config.num_target_layers == 6 and config.num_hidden_layers == 3
    assert config.resolved_layer_types == ["full_attention"] * 3


def test_sliding_config_defaults_to_sliding_layers_with_a_full_last_layer(tiny_target):
    config = DrafterConfig.from_target(tiny_target.config, num_layers=3, block_size=16,
                                       target_layer_ids=[1, 2], mask_token_id=7, sliding_window=2048)
    assert config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    hf = config.to_hf_dict()
    assert hf["use_sliding_window"] is True and hf["sliding_window"] == 2048
    assert DrafterConfig.from_hf_dict(hf) == config
    with pytest.raises(ValueError):
        DrafterConfig.from_target(tiny_target.config, num_layers=3, block_size=16, target_layer_ids=[1],
                                  mask_token_id=7, layer_types=["full_attention"])


def test_shared_modules_are_frozen_and_not_part_of_the_drafter(tiny_target):
    drafter = make_drafter(tiny_target)
    names = set(drafter.state_dict())
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert all(p.requires_grad for p in drafter.parameters())
    assert not any(p is tiny_target.lm_head.weight or p is tiny_target.embed_tokens.weight
                   for p in drafter.parameters())
    assert drafter.lm_head is tiny_target.lm_head and drafter.embed_tokens is tiny_target.embed_tokens
    assert drafter.fc.weight.shape == (64, 64 * len(tiny_target.layer_ids))


def test_rope_and_norm_match_the_targets_qwen3_modules(tiny_target):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

    from trainer.model.drafter import RMSNorm, RotaryEmbedding

    positions = torch.arange(50).unsqueeze(0)
    x = torch.randn(1, 50, 16)
    reference = Qwen3RotaryEmbedding(tiny_target.config)(x, positions)
    ours = RotaryEmbedding(16, tiny_target.config.rope_parameters["rope_theta"])(positions, torch.float32)
    torch.testing.assert_close(ours[0], reference[0])
    torch.testing.assert_close(ours[1], reference[1])
    norm, hf_norm = RMSNorm(16, 1e-6), Qwen3RMSNorm(16, 1e-6)
    torch.testing.assert_close(norm(x), hf_norm(x))


def test_draft_equals_the_training_forward_for_one_block(tiny_target):
    drafter = make_drafter(tiny_target, block_size=6).eval()
    input_ids = random_ids(tiny_target, (1, 30), seed=2)
    features = tiny_target.features(input_ids)
    anchor = 17
    drafted = drafter.draft(features[:, :anchor], int(input_ids[0, anchor]), anchor)
    # the training forward sees the whole sequence's features; its mask must hide positions >= anchor
    with torch.no_grad():
        hidden = drafter(features, input_ids[:, [anchor]], torch.tensor([[anchor]], device=tiny_target.device))
        expected = tiny_target.lm_head(hidden[0, 0, 1:]).argmax(-1)
    assert drafted.shape == (5,) and drafted.dtype == torch.long
    assert torch.equal(drafted, expected)
    torch.testing.assert_close(drafter.draft_logits(features, int(input_ids[0, anchor]), anchor),
                               drafter.draft_logits(features[:, :anchor], int(input_ids[0, anchor]), anchor))


def test_draft_rejects_a_context_shorter_than_the_anchor(tiny_target):
    drafter = make_drafter(tiny_target)
    features = tiny_target.features(random_ids(tiny_target, (1, 10)))
    with pytest.raises(ValueError):
        drafter.draft(features, 5, 12)


def test_bf16_drafter_runs_and_keeps_rope_exact(tiny_target):
    drafter = make_drafter(tiny_target, block_size=4).to(torch.bfloat16)
    input_ids = random_ids(tiny_target, (1, 20), seed=6)
    features = tiny_target.features(input_ids)
    hidden = drafter(features, input_ids[:, [3, 9]], torch.tensor([[3, 9]], device=tiny_target.device))
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden.float()).all()
