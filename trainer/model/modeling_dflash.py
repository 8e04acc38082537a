"""DFlash drafter modeling: the layers the trainer trains, and `DFlashDraftModel`, the same layers as a
transformers model.

Every checkpoint ships this file verbatim as `dflash.py` with `auto_map: {"AutoModel": "dflash.DFlashDraftModel"}`
in its config.json, so `AutoModel.from_pretrained(checkpoint, trust_remote_code=True)` runs the very code the
trainer ran (trainer/model/drafter.py builds its drafter from the classes below). It must therefore import nothing but
torch, transformers and the standard library.

Inputs of `DFlashDraftModel.forward`: `target_hidden` [B, S, k*H], the target's tapped hidden states
(`hidden_states[i + 1]` for each id i of `dflash_config.target_layer_ids`, concatenated) at positions 0..S-1;
`noise_embedding` [B, A*Bs, H], the target's embedding of each block's tokens (the anchor token, then Bs-1 mask
tokens: `block_input_ids` builds them); `anchors` [B, A], each block's position (-1: a padded block). Output:
the final-normed hidden states [B, A, Bs, H]; the target's LM head over slots 1..Bs-1 gives the drafted tokens'
logits. A block sees the context positions before its anchor only, and its own slots.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config
from transformers.modeling_outputs import BaseModelOutput

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------------------------------------- attention mask

def block_mask_mod(anchors: torch.Tensor, *, context_len: int, block_size: int,
                   window: int | None = None) -> MaskMod:
    """mask_mod(b, h, q_idx, kv_idx) -> bool for anchors [batch, num_blocks] (-1 marks a padded block).

    Queries are the block tokens, block after block; keys/values are [context 0..S-1 | the same block tokens].
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


def dense_mask(mask_mod: MaskMod, batch: int, q_len: int, kv_len: int, *, device) -> torch.Tensor:
    """[batch, 1, q_len, kv_len] bool, evaluated from the mask_mod by broadcasting (no vmap)."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q_idx = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
    kv_idx = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
    return mask_mod(b, h, q_idx, kv_idx).expand(batch, 1, q_len, kv_len)


class DenseMask:
    """The masks of one forward pass as dense boolean tensors for SDPA, one per layer type."""

    backend = "sdpa"

    def __init__(self, masks: dict) -> None:
        self.masks = masks

    def attend(self, layer_type: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               *, scale: float) -> torch.Tensor:
        # fully masked rows (padded blocks) come out as zeros, as with flex_attention
        return F.scaled_dot_product_attention(query, key, value, attn_mask=self.masks[layer_type], scale=scale,
                                              enable_gqa=True)


def dense_drafter_masks(anchors: torch.Tensor, *, context_len: int, block_size: int, layer_types: list[str],
                        sliding_window: int | None) -> dict:
    """layer type -> [batch, 1, A*Bs, S + A*Bs] bool mask (True = attend)."""
    batch, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    masks = {}
    for layer_type in sorted(set(layer_types)):
        window = sliding_window if layer_type == SLIDING_ATTENTION else None
        mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
        masks[layer_type] = dense_mask(mask_mod, batch, q_len, context_len + q_len, device=anchors.device)
    return masks


# ---------------------------------------------------------------------------------------------- layers

class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # the output keeps the input's dtype: an fp32 master weight must not turn a bf16 residual stream into fp32
        # (every projection would then cast it back, and the saved activations double)
        return (self.weight * x.to(dtype)).to(dtype)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE (rotate-half), as Qwen3, SGLang and vLLM apply it.

    The frequencies are recomputed in fp32 on every call rather than kept as a buffer, so casting the drafter
    to bf16 never degrades the positions."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        inv_freq = 1.0 / (self.theta ** exponents)
        freqs = positions.float()[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, L, D]; cos/sin: [B, L, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DrafterAttention(nn.Module):
    """Queries from the block tokens; keys/values from [context features ; block tokens], k_norm on both."""

    def __init__(self, config, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        h, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        return x.view(*x.shape[:2], num_heads, self.head_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope_q, rope_kv, mask) -> torch.Tensor:
        """x: block tokens [B, Q, H]; context: projected target features [B, S, H]; mask: has attend()."""
        q = self.q_norm(self._heads(self.q_proj(x), self.num_heads)).transpose(1, 2)
        kv_input = torch.cat([context, x], dim=1)
        k = self.k_norm(self._heads(self.k_proj(kv_input), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(kv_input), self.num_kv_heads).transpose(1, 2)
        q, k = apply_rope(q, *rope_q), apply_rope(k, *rope_kv)
        out = mask.attend(self.layer_type, q, k, v, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DrafterMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, config, layer_type: str):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, layer_type)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DrafterMLP(config)

    def forward(self, x, context, rope_q, rope_kv, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def block_input_ids(anchor_tokens: torch.Tensor, *, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[B, A] anchor tokens -> [B, A*Bs]: the anchor's token in slot 0, the mask token in slots 1..Bs-1."""
    tokens = torch.full((*anchor_tokens.shape, block_size), mask_token_id, dtype=torch.long,
                        device=anchor_tokens.device)
    tokens[..., 0] = anchor_tokens
    return tokens.flatten(1)


class DFlashBlocks:
    """The drafter's modules and forward, shared by the trainer's drafter and `DFlashDraftModel` (a mixin of
    nn.Module subclasses: the tensor names are DFLASH.md's, `fc`, `hidden_norm`, `layers.{i}`, `norm`)."""

    def build_blocks(self, config, *, layer_types: list[str], num_taps: int, rope_theta: float) -> None:
        self.fc = nn.Linear(num_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(config, t) for t in layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, rope_theta)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """[B, S, k*H] tapped target states -> [B, S, H] context for every layer's keys/values."""
        if not torch.is_autocast_enabled(features.device.type):  # under autocast fc reads bf16 features as they are
            features = features.to(self.fc.weight.dtype)
        return self.hidden_norm(self.fc(features))

    def run_blocks(self, context: torch.Tensor, x: torch.Tensor, anchors: torch.Tensor, mask,
                   layers: list[int] | None = None) -> torch.Tensor:
        """Block embeddings x [B, A*Bs, H] through the layers -> final-normed [B, A, Bs, H]."""
        batch, context_len = context.shape[:2]
        num_blocks = anchors.shape[1]
        block_size = x.shape[1] // num_blocks
        x = x.to(context.dtype)
        offsets = torch.arange(block_size, device=anchors.device)
        positions = (anchors.clamp(min=0)[..., None] + offsets).flatten(1)  # padded blocks: harmless positions
        context_positions = torch.arange(context_len, device=anchors.device).expand(batch, context_len)
        rope_q = self.rotary(positions, x.dtype)
        rope_kv = self.rotary(torch.cat([context_positions, positions], dim=1), x.dtype)
        for layer in self.layers if layers is None else [self.layers[i] for i in layers]:
            x = layer(x, context, rope_q, rope_kv, mask)
        return self.norm(x).view(batch, num_blocks, block_size, -1)


# ---------------------------------------------------------------------------------------------- transformers model

def rope_theta_of(config) -> float:
    """RoPE base of a config: transformers 5 keeps it in rope_parameters, older releases as rope_theta."""
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


class DFlashDraftModel(DFlashBlocks, PreTrainedModel):
    """The drafter as a transformers model (config: the checkpoint's Qwen3 config with `block_size`,
    `dflash_config` and `layer_types`). It holds no embedding and no LM head: they are the target's."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DrafterLayer"]
    _supports_sdpa = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.layer_types = list(config.layer_types or [FULL_ATTENTION] * config.num_hidden_layers)
        self.block_size = int(config.block_size)
        self.mask_token_id = int(config.dflash_config["mask_token_id"])
        self.target_layer_ids = list(config.dflash_config["target_layer_ids"])
        self.sliding_window = config.sliding_window if SLIDING_ATTENTION in self.layer_types else None
        self.build_blocks(config, layer_types=self.layer_types, num_taps=len(self.target_layer_ids),
                          rope_theta=rope_theta_of(config))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def block_input_ids(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B, A] anchor tokens -> [B, A*Bs] block tokens; embed them with the target's embedding."""
        return block_input_ids(anchor_tokens, block_size=self.block_size, mask_token_id=self.mask_token_id)

    def forward(self, target_hidden: torch.Tensor, noise_embedding: torch.Tensor, anchors: torch.Tensor,
                **kwargs) -> BaseModelOutput:
        """Hidden states [B, A, Bs, H] of every block slot (the module docstring says what goes in)."""
        context = self.project_context(target_hidden)
        masks = dense_drafter_masks(anchors, context_len=context.shape[1], block_size=self.block_size,
                                    layer_types=self.layer_types, sliding_window=self.sliding_window)
        return BaseModelOutput(last_hidden_state=self.run_blocks(context, noise_embedding, anchors,
                                                                 DenseMask(masks)))
