"""Random models of real shapes and random token data, for the benchmarks and the GPU checks: throughput
depends on the shapes alone, so no real weights need to be downloaded to measure it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

_QWEN3_COMMON = dict(head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                     rope_theta=1_000_000.0)
SHAPES = {
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, **_QWEN3_COMMON),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, **_QWEN3_COMMON),
    # the 27B class: 64 layers, as the seed run's target (taps [1, 16, 31, 46, 61])
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, **_QWEN3_COMMON),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096,
                 rms_norm_eps=1e-6, rope_theta=10_000.0),
}
# Qwen3.5/3.6 hybrids: three Gated DeltaNet layers to every gated full-attention one (partial RoPE, theta 1e7)
_QWEN3_5_COMMON = dict(head_dim=256, vocab_size=248320, max_position_embeddings=262144, rms_norm_eps=1e-6,
                       rope_theta=10_000_000.0, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_num_key_heads=16, full_attention_interval=4)
HYBRID_SHAPES = {
    "qwen3.6-27b": dict(model_type="qwen3_5_text", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                        num_attention_heads=24, num_key_value_heads=4, linear_num_value_heads=48, **_QWEN3_5_COMMON),
    "qwen3.6-35b-a3b": dict(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40,
                            num_attention_heads=16, num_key_value_heads=2, linear_num_value_heads=32,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, **_QWEN3_5_COMMON),
    "tiny-hybrid": dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10_000.0,
                        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                        linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=4),
}
SHAPES.update(HYBRID_SHAPES)


def target_config(shape: dict, *, num_layers: int | None = None, **overrides):
    """A transformers config of `shape` (one of SHAPES: a Qwen3Config, or a Qwen3.5 text config for the hybrid
    ones), optionally cut to its first `num_layers` (the layer types of the full model's first layers)."""
    import transformers

    sizes = {k: v for k, v in shape.items() if k not in ("rope_theta", "model_type", "full_attention_interval")}
    rope = {"rope_type": "default", "rope_theta": shape["rope_theta"]}
    model_type = shape.get("model_type", "qwen3")
    if model_type != "qwen3":
        interval = shape["full_attention_interval"]
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(shape["num_hidden_layers"])]
        sizes["layer_types"] = types[:num_layers]
        rope["partial_rotary_factor"] = 0.25
    if num_layers is not None:
        sizes["num_hidden_layers"] = num_layers
    config_class = {"qwen3": transformers.Qwen3Config, "qwen3_5_text": transformers.Qwen3_5TextConfig,
                    "qwen3_5_moe_text": transformers.Qwen3_5MoeTextConfig}[model_type]
    options = dict(tie_word_embeddings=False, pad_token_id=0, rope_parameters=rope)
    return config_class(**sizes, **{**options, **overrides})


def causal_lm_class(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def write_random_target(out_dir: Path, shape_name: str, *, device: str = "cuda", seed: int = 0) -> Path:
    """A random-initialised bf16 target of a real shape and a small local tokenizer, saved as an HF model
    directory (its embedding rows past the tokenizer are never produced by it, like a real padded vocabulary)."""
    import torch

    from trainer.model.tiny_target import build_tokenizer

    tokenizer = build_tokenizer(320)
    config = target_config(SHAPES[shape_name], eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = causal_lm_class(config)._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return Path(out_dir)


def write_random_dataset(out_dir: Path, *, samples: int, min_len: int, max_len: int, vocab: int,
                         seed: int = 0) -> Path:
    """A prepared dataset (input_ids, loss_mask) of random tokens: a quarter of each sample is the prompt."""
    import datasets

    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, samples)
    ids = [rng.integers(0, vocab, n).astype(np.int32) for n in lengths]
    masks = [np.r_[np.zeros(n // 4, np.int8), np.ones(n - n // 4, np.int8)] for n in lengths]
    datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": masks}).save_to_disk(str(out_dir))
    return Path(out_dir)
