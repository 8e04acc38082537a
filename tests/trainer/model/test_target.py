from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.tiny_models import device, tiny_target, tiny_target_dir  # noqa: F401  (fixtures)
from trainer.errors import TrainerError
from trainer.model.target import TargetModel
from trainer.planning.taps import default_target_layer_ids


@pytest.mark.parametrize("num_layers, num_taps, expected", [
    (36, 5, [1, 9, 17, 25, 33]),
    (64, 5, [1, 16, 31, 46, 61]),
    (36, 1, [18]),
    (7, 1, [3]),
    (28, 3, [1, 13, 25]),
])
def test_default_target_layer_ids(num_layers, num_taps, expected):
    assert default_target_layer_ids(num_layers, num_taps) == expected


def test_default_target_layer_ids_rejects_impossible_requests():
    with pytest.raises(TrainerError):
        default_target_layer_ids(36, 0)
    with pytest.raises(TrainerError):
        default_target_layer_ids(5, 4)


def test_tiny_target_is_deterministic_per_seed(tmp_path):
    from safetensors.torch import load_file

    from trainer.model.tiny_target import write_tiny_target

    a = load_file(write_tiny_target(tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(write_tiny_target(tmp_path / "b", seed=3) / "model.safetensors")
    c = load_file(write_tiny_target(tmp_path / "c", seed=4) / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_target_loads_with_auto_classes(tiny_target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    config = json.loads((tiny_target_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (64, 6, 16)
    assert model.config.vocab_size == len(tokenizer) < 1000
    assert tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id) == "<|MASK|>"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi bamon, zou?"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text


def _hf_tapped_states(target, input_ids, attention_mask=None):
    out = target.hf_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in target.layer_ids], dim=-1)


def test_features_equal_hf_hidden_states(tiny_target):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, tiny_target.config.vocab_size, (2, 24), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 17:] = 0
    input_ids = input_ids.to(tiny_target.device)
    attention_mask = attention_mask.to(tiny_target.device)
    with torch.no_grad():
        expected = _hf_tapped_states(tiny_target, input_ids)
        expected_padded = _hf_tapped_states(tiny_target, input_ids, attention_mask)
    features = tiny_target.features(input_ids)
    assert features.shape == (2, 24, len(tiny_target.layer_ids) * 64)
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
    # right padding: the mask is dropped, real positions are unchanged (padded ones are never read)
    real = attention_mask.bool()
    torch.testing.assert_close(tiny_target.features(input_ids, attention_mask.cpu())[real], expected_padded[real],
                               rtol=1e-5, atol=1e-5)
    assert not features.requires_grad


def test_a_mask_that_is_not_right_padding_is_applied(tiny_target):
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, tiny_target.config.vocab_size, (2, 16), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0            # left padding: real tokens after pads
    on_device = input_ids.to(tiny_target.device), attention_mask.to(tiny_target.device)
    with torch.no_grad():
        expected = _hf_tapped_states(tiny_target, *on_device)
        unmasked = _hf_tapped_states(tiny_target, on_device[0])
    got = tiny_target.features(input_ids, attention_mask)
    real = on_device[1].bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[0, 5:], unmasked[0, 5:], atol=1e-3)


def test_right_padded_batches_run_the_layers_without_a_mask(tiny_target):
    """The unmasked causal call is what lets SDPA pick its flash kernel on a GPU."""
    seen = []
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
        for layer in tiny_target.decoder.layers]
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    try:
        tiny_target.features(torch.ones(2, 4, dtype=torch.long), right)
        assert seen and all(mask is None for mask in seen)
        seen.clear()
        tiny_target.features(torch.ones(2, 4, dtype=torch.long), right.flip(1))
        assert seen and all(mask is not None for mask in seen)
    finally:
        for hook in hooks:
            hook.remove()


def test_layers_after_the_last_tap_do_not_run(tiny_target):
    calls = [0] * tiny_target.num_layers
    hooks = [layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, layer in enumerate(tiny_target.decoder.layers)]
    norm_calls = []
    hooks.append(tiny_target.decoder.norm.register_forward_hook(lambda *_: norm_calls.append(1)))
    try:
        tiny_target.features(torch.zeros(1, 8, dtype=torch.long, device=tiny_target.device))
    finally:
        for hook in hooks:
            hook.remove()
    last = tiny_target.layer_ids[-1]
    assert calls == [1] * (last + 1) + [0] * (tiny_target.num_layers - last - 1)
    assert last < tiny_target.num_layers - 1 and not norm_calls


def test_target_is_frozen_and_shares_its_modules(tiny_target):
    assert all(not p.requires_grad for p in tiny_target.hf_model.parameters())
    assert tiny_target.embed_tokens is tiny_target.hf_model.get_input_embeddings()
    assert tiny_target.lm_head is tiny_target.hf_model.lm_head
    assert tiny_target.mask_token_id == tiny_target.tokenizer.mask_token_id
    logits = tiny_target.logits(torch.zeros(1, 5, dtype=torch.long, device=tiny_target.device))
    assert logits.shape == (1, 5, tiny_target.config.vocab_size)


def test_load_rejects_bad_directories_and_layer_ids(tmp_path, tiny_target_dir):
    with pytest.raises(TrainerError, match="does not exist"):
        TargetModel.load(tmp_path / "missing", layer_ids=None, num_taps=3)
    with pytest.raises(TrainerError, match="config.json"):
        TargetModel.load(tmp_path, layer_ids=None, num_taps=3)
    with pytest.raises(TrainerError, match="out of range"):
        TargetModel.load(tiny_target_dir, layer_ids=[1, 6], num_taps=2)


def _write_other_target(out_dir, kind):
    """A tiny Llama, or a tiny Qwen3 with sliding-window layers, next to the tiny target's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from trainer.model.tiny_target import build_tokenizer

    tokenizer = build_tokenizer(320)
    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                  initializer_range=0.2)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        config = Qwen3Config(**common, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                             layer_types=["full_attention"] + ["sliding_attention"] * 4)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.mark.parametrize("kind", ["llama", "qwen3_sliding"])
def test_features_of_other_targets_equal_hf_hidden_states(tmp_path, kind):
    target = TargetModel.load(_write_other_target(tmp_path, kind), layer_ids=[1, 3], num_taps=2)
    input_ids = torch.randint(0, target.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 14:] = 0
    with torch.no_grad():
        expected = _hf_tapped_states(target, input_ids, attention_mask)
    got = target.features(input_ids, attention_mask)
    # padded positions are never used as context; compare the real ones
    torch.testing.assert_close(got[attention_mask.bool()], expected[attention_mask.bool()],
                               rtol=1e-5, atol=1e-5)


class _FakeTokenizer:
    def __init__(self, vocab, mask_token_id=None):
        self.vocab, self.mask_token_id = vocab, mask_token_id

    def get_vocab(self):
        return self.vocab

    def __len__(self):
        return len(self.vocab)


def test_mask_token_id_is_the_tokenizers_then_mask_then_the_first_spare_row():
    from trainer.model.target import resolve_mask_token_id

    vocab = {f"t{i}": i for i in range(10)}
    assert resolve_mask_token_id(_FakeTokenizer(vocab, mask_token_id=4), 16) == 4
    assert resolve_mask_token_id(_FakeTokenizer({**vocab, "<|MASK|>": 10}), 16) == 10
    # Qwen3: 151669 tokens in the tokenizer, 151936 embedding rows -> 151669
    assert resolve_mask_token_id(_FakeTokenizer(vocab), 16) == 10
    with pytest.raises(TrainerError):
        resolve_mask_token_id(_FakeTokenizer(vocab), 10)
