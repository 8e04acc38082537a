"""The drafter checkpoint: DFLASH.md's tensor names and config keys, and a bit-exact round trip."""
from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)
from trainer.errors import TrainerError
from trainer.model.drafter_files import load_drafter, save_drafter


def _expected_names(num_layers):
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(num_layers):
        names |= {f"layers.{i}.input_layernorm.weight", f"layers.{i}.post_attention_layernorm.weight"}
        names |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        names |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        names |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    return names


def test_tensor_names_and_shapes_are_dflash_md_s(tiny_target, tmp_path):
    from safetensors.torch import load_file

    save_drafter(make_drafter(tiny_target, num_layers=2), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert set(tensors) == _expected_names(2)
    assert tensors["fc.weight"].shape == (64, 64 * len(tiny_target.layer_ids))
    assert tensors["layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert tensors["layers.0.self_attn.q_norm.weight"].shape == (16,)


def test_config_keys_are_dflash_md_s(tiny_target, tmp_path):
    save_drafter(make_drafter(tiny_target, num_layers=2, block_size=8), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    target = tiny_target.config
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "rms_norm_eps", "vocab_size", "max_position_embeddings"):
        assert config[key] == getattr(target, key), key
    assert config["num_hidden_layers"] == 2 and config["block_size"] == 8
    assert config["num_target_layers"] == tiny_target.num_layers
    assert config["dflash_config"] == {"mask_token_id": tiny_target.mask_token_id,
                                       "target_layer_ids": tiny_target.layer_ids}
    assert config["rope_theta"] == tiny_target.config.rope_parameters["rope_theta"]
    assert config["use_sliding_window"] is False


def test_sliding_config_keys(tiny_target, tmp_path):
    save_drafter(make_drafter(tiny_target, num_layers=2, sliding_window=64), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["sliding_window"] == 64 and config["use_sliding_window"] is True


@pytest.mark.parametrize("sliding_window", [None, 5])
def test_round_trip_reproduces_logits_bit_for_bit(tiny_target, tmp_path, sliding_window):
    drafter = make_drafter(tiny_target, num_layers=2, block_size=4, sliding_window=sliding_window, seed=11)
    # move the weights off their initial values so that an unloaded drafter could not pass
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_drafter(drafter, tmp_path)
    loaded = load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head,
                          device=tiny_target.device)
    fresh = make_drafter(tiny_target, num_layers=2, block_size=4, sliding_window=sliding_window, seed=12)
    input_ids = random_ids(tiny_target, (2, 20), seed=7)
    features = tiny_target.features(input_ids)
    anchors = torch.tensor([[2, 8, 13], [4, 10, -1]], device=tiny_target.device)
    tokens = input_ids.gather(1, anchors.clamp(min=0))
    with torch.no_grad():
        expected = tiny_target.lm_head(drafter(features, tokens, anchors))
        got = tiny_target.lm_head(loaded(features, tokens, anchors))
        other = tiny_target.lm_head(fresh(features, tokens, anchors))
    assert torch.equal(got, expected)
    assert not torch.equal(other, expected)
    assert loaded.config == drafter.config


def test_bf16_export_records_its_dtype(tiny_target, tmp_path):
    save_drafter(make_drafter(tiny_target), tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head)
    assert loaded.fc.weight.dtype == torch.bfloat16


def test_load_rejects_what_is_not_a_matching_drafter(tiny_target, tmp_path):
    with pytest.raises(TrainerError, match="no config.json"):
        load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head)
    save_drafter(make_drafter(tiny_target), tmp_path)
    wrong_head = torch.nn.Linear(64, 999, bias=False)
    with pytest.raises(TrainerError, match="another target"):
        load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=wrong_head)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(TrainerError, match="model.safetensors"):
        load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(TrainerError, match="not a DFlash drafter"):
        load_drafter(tmp_path, embed_tokens=tiny_target.embed_tokens, lm_head=tiny_target.lm_head)


def test_save_unwraps_compiled_and_ddp_style_wrappers(tiny_target, tmp_path):
    from safetensors.torch import load_file

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    save_drafter(Wrapper(make_drafter(tiny_target, num_layers=1)), tmp_path)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == _expected_names(1)
