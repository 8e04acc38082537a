"""The size of a target from its text config alone (torch-free): its parameters, counted layer by layer as
transformers builds them (hybrid Qwen3.5/3.6 layers by type: Gated DeltaNet or gated full attention; MoE layers
with their router, experts and shared expert), and what one of its layers holds per token in the feature pass."""
from __future__ import annotations

from trainer.planning.target_families import LINEAR, layer_types_of

FP32 = 4
FLA_CHUNK = 64                   # tokens per chunk of the gated delta rule kernels (their per-chunk states)


def _head_dim(text: dict) -> int:
    return int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])


def _full_attention_params(text: dict) -> int:
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    kv_heads, head_dim = int(text.get("num_key_value_heads") or heads), _head_dim(text)
    model_type = str(text.get("model_type", ""))
    gated = model_type.startswith("qwen3_5")                 # q_proj also yields the output gate
    q_out, kv_out = heads * head_dim * (2 if gated else 1), kv_heads * head_dim
    params = hidden * (q_out + 2 * kv_out) + heads * head_dim * hidden
    if model_type == "qwen2" or text.get("attention_bias"):  # qwen2 always has q/k/v biases
        params += q_out + 2 * kv_out + (hidden if text.get("attention_bias") else 0)
    if model_type.startswith("qwen3"):                       # per-head RMSNorm of q and k
        params += 2 * head_dim
    return params


def _linear_attention_dims(text: dict) -> tuple[int, int, int]:
    key_dim = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
    value_dim = int(text["linear_num_value_heads"]) * int(text["linear_value_head_dim"])
    return key_dim, value_dim, 2 * key_dim + value_dim


def _linear_attention_params(text: dict) -> int:
    """Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b/a, the depthwise conv1d, dt_bias, A_log, the gated norm
    and out_proj."""
    hidden, v_heads = int(text["hidden_size"]), int(text["linear_num_value_heads"])
    key_dim, value_dim, conv_dim = _linear_attention_dims(text)
    kernel = int(text["linear_conv_kernel_dim"])
    return (hidden * conv_dim + hidden * value_dim + 2 * hidden * v_heads + conv_dim * kernel
            + 2 * v_heads + int(text["linear_value_head_dim"]) + value_dim * hidden)


def _is_moe_layer(text: dict, index: int) -> bool:
    experts = int(text.get("num_experts") or 0)
    if experts == 0 or index in (text.get("mlp_only_layers") or []):
        return False
    return (index + 1) % int(text.get("decoder_sparse_step") or 1) == 0


def _mlp_params(text: dict, index: int) -> int:
    hidden = int(text["hidden_size"])
    if not _is_moe_layer(text, index):
        return 3 * hidden * int(text["intermediate_size"])
    experts, expert_width = int(text["num_experts"]), int(text["moe_intermediate_size"])
    params = experts * hidden + experts * 3 * hidden * expert_width     # router + experts
    shared = int(text.get("shared_expert_intermediate_size") or 0)
    if shared:
        params += 3 * hidden * shared + hidden                             # shared expert + its gate
    return params


def target_params(text: dict) -> int:
    """Parameters of the language model of a text config (embedding, layers, final norm, LM head)."""
    hidden, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    total = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2) + hidden
    for index, kind in enumerate(layer_types_of(text)):
        attention = _linear_attention_params(text) if kind == LINEAR else _full_attention_params(text)
        total += 2 * hidden + attention + _mlp_params(text, index)
    return total


def target_layer_working_bytes(text: dict, act: int) -> int:
    """Per token, the most one target layer holds at once in the no-grad feature pass: its input and output,
    and its attention's or its MLP's intermediates (whichever is larger). The gated delta rule's kernels keep one
    fp32 state per chunk of FLA_CHUNK tokens; the torch fallback path is not covered."""
    hidden = int(text["hidden_size"])
    experts = int(text.get("num_experts") or 0)
    width = int(text.get("intermediate_size") or 0) if not experts else (
        int(text.get("shared_expert_intermediate_size") or 0)
        + int(text.get("num_experts_per_tok") or 1) * int(text["moe_intermediate_size"]))
    mlp = 3 * act * width + FP32 * experts
    heads, head_dim = int(text["num_attention_heads"]), _head_dim(text)
    kv_width = int(text.get("num_key_value_heads") or heads) * head_dim
    attention = act * (3 * heads * head_dim + 2 * kv_width) + FP32 * (heads * head_dim + kv_width)
    if LINEAR in layer_types_of(text):
        key_dim, value_dim, conv_dim = _linear_attention_dims(text)
        v_heads = int(text["linear_num_value_heads"])
        states = FP32 * v_heads * int(text["linear_key_head_dim"]) * int(text["linear_value_head_dim"]) // FLA_CHUNK
        attention = max(attention, act * (2 * conv_dim + 2 * value_dim) + FP32 * 2 * key_dim + states)
    return 2 * act * hidden + max(mlp, attention)
