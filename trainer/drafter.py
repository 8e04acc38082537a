"""The DFlash drafter: Qwen3-style decoder layers whose keys/values also carry the target's context features."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from trainer.families import DrafterShape, drafter_shape, target_spec
from trainer.masks import FULL_ATTENTION, SLIDING_ATTENTION, DrafterMask, build_drafter_mask, choose_backend


@dataclass
class DrafterConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    block_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    initializer_range: float = 0.02
    extra: dict = field(default_factory=dict)   # target fields copied through to config.json (bos/eos ids)

    def __post_init__(self):
        if self.sliding_window is not None and self.layer_types is None:
            # every layer slides except the last, which keeps the whole context in view
            self.layer_types = [SLIDING_ATTENTION] * (self.num_hidden_layers - 1) + [FULL_ATTENTION]
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    @property
    def resolved_layer_types(self) -> list[str]:
        return self.layer_types or [FULL_ATTENTION] * self.num_hidden_layers

    @classmethod
    def from_target(cls, target_config, *, num_layers: int, block_size: int, target_layer_ids: list[int],
                    mask_token_id: int, shape: DrafterShape | None = None, sliding_window: int | None = None,
                    layer_types: list[str] | None = None) -> "DrafterConfig":
        """Hidden size and vocabulary follow the target (an HF text config); heads, head size, MLP width, window
        and RoPE base come from `shape` (default: the target family's recipe, families.recipe_shape), with
        `sliding_window` over it when given (0 = none)."""
        if shape is None:
            shape = drafter_shape(target_spec(target_config.to_dict()), sliding_window=sliding_window)
        elif sliding_window is not None:
            shape = replace(shape, sliding_window=sliding_window or None)
        extra = {key: getattr(target_config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")
                 if getattr(target_config, key, None) is not None}
        return cls(
            hidden_size=target_config.hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim,
            intermediate_size=shape.intermediate_size, rms_norm_eps=target_config.rms_norm_eps,
            rope_theta=float(shape.rope_theta), vocab_size=target_config.vocab_size,
            max_position_embeddings=target_config.max_position_embeddings, block_size=block_size,
            num_target_layers=target_config.num_hidden_layers, target_layer_ids=list(target_layer_ids),
            mask_token_id=mask_token_id, sliding_window=shape.sliding_window, layer_types=layer_types, extra=extra,
        )

    def to_hf_dict(self) -> dict:
        """config.json as SGLang and vLLM read a DFlash drafter."""
        out = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
        }
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings",
                    "initializer_range", "block_size", "num_target_layers"):
            out[key] = getattr(self, key)
        out["rope_scaling"] = None
        out["dflash_config"] = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        out["layer_types"] = self.resolved_layer_types
        out["use_sliding_window"] = self.sliding_window is not None
        out["sliding_window"] = self.sliding_window
        out.update(self.extra)
        return out

    @classmethod
    def from_hf_dict(cls, data: dict) -> "DrafterConfig":
        known = {f for f in cls.__dataclass_fields__ if f not in ("extra", "mask_token_id", "target_layer_ids")}
        kwargs = {key: data[key] for key in known if key in data}
        kwargs["mask_token_id"] = data["dflash_config"]["mask_token_id"]
        kwargs["target_layer_ids"] = list(data["dflash_config"]["target_layer_ids"])
        if not data.get("use_sliding_window", data.get("sliding_window") is not None):
            kwargs["sliding_window"], kwargs["layer_types"] = None, None
        kwargs["extra"] = {k: data[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in data}
        return cls(**kwargs)

    def as_dict(self) -> dict:
        return asdict(self)


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
    def __init__(self, config: DrafterConfig, layer_type: str):
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

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope_q, rope_kv, mask: DrafterMask) -> torch.Tensor:
        """x: block tokens [B, Q, H]; context: projected target features [B, S, H]."""
        q = self.q_norm(self._heads(self.q_proj(x), self.num_heads)).transpose(1, 2)
        kv_input = torch.cat([context, x], dim=1)
        k = self.k_norm(self._heads(self.k_proj(kv_input), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(kv_input), self.num_kv_heads).transpose(1, 2)
        q, k = apply_rope(q, *rope_q), apply_rope(k, *rope_kv)
        out = mask.attend(self.layer_type, q, k, v, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DrafterMLP(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig, layer_type: str):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, layer_type)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DrafterMLP(config)

    def forward(self, x, context, rope_q, rope_kv, mask: DrafterMask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The drafter. The target's embedding and LM head are used but never registered: they stay frozen and
    out of state_dict(), parameters() and the checkpoint."""

    def __init__(self, config: DrafterConfig, *, embed_tokens: nn.Embedding, lm_head: nn.Linear,
                 attention_backend: str = "auto"):
        super().__init__()
        self.config = config
        self.attention_backend = attention_backend
        self.__dict__["embed_tokens"] = embed_tokens
        self.__dict__["lm_head"] = lm_head
        num_taps = len(config.target_layer_ids)
        self.fc = nn.Linear(num_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(config, t) for t in config.resolved_layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """[B, S, k*H] tapped target states -> [B, S, H] context for every layer's keys/values."""
        if not torch.is_autocast_enabled(features.device.type):  # under autocast fc reads bf16 features as they are
            features = features.to(self.fc.weight.dtype)
        return self.hidden_norm(self.fc(features))

    def block_positions(self, anchors: torch.Tensor) -> torch.Tensor:
        """[B, A*Bs]: anchor + k for slot k (padded blocks get harmless positions from 0)."""
        offsets = torch.arange(self.config.block_size, device=anchors.device)
        return (anchors.clamp(min=0)[..., None] + offsets).flatten(1)

    def block_tokens(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B, A*Bs]: the anchor's real token in slot 0, the mask token in slots 1..Bs-1."""
        tokens = torch.full((*anchor_tokens.shape, self.config.block_size), self.config.mask_token_id,
                            dtype=torch.long, device=anchor_tokens.device)
        tokens[..., 0] = anchor_tokens
        return tokens.flatten(1)

    def forward(self, features: torch.Tensor, anchor_tokens: torch.Tensor, anchors: torch.Tensor,
                *, backend: str | None = None, layers: list[int] | None = None) -> torch.Tensor:
        """Final-normed hidden states [B, A, Bs, H] of every block slot; anchors [B, A], -1 for padded blocks.

        Apply `lm_head` to slots 1..Bs-1 (objective.py does it in chunks). `layers` runs only those layers (the
        start-up compile warms one layer of each type)."""
        context = self.project_context(features)
        batch, context_len = context.shape[:2]
        x = self.embed_tokens(self.block_tokens(anchor_tokens)).to(context.dtype)
        positions = self.block_positions(anchors)
        context_positions = torch.arange(context_len, device=anchors.device).expand(batch, context_len)
        rope_q = self.rotary(positions, x.dtype)
        rope_kv = self.rotary(torch.cat([context_positions, positions], dim=1), x.dtype)
        mask = build_drafter_mask(
            anchors, context_len=context_len, block_size=self.config.block_size,
            layer_types=self.config.resolved_layer_types, sliding_window=self.config.sliding_window,
            backend=choose_backend(anchors.device, backend or self.attention_backend))
        for layer in self.layers if layers is None else [self.layers[i] for i in layers]:
            x = layer(x, context, rope_q, rope_kv, mask)
        return self.norm(x).view(batch, anchors.shape[1], self.config.block_size, -1)

    @torch.no_grad()
    def draft_logits(self, context_features: torch.Tensor, anchor_token: int, anchor_pos: int) -> torch.Tensor:
        """[Bs-1, V] logits of one block; context_features [1, S, k*H] holds the states of positions < anchor."""
        if context_features.shape[1] < anchor_pos:
            raise ValueError(f"context has {context_features.shape[1]} positions, anchor is at {anchor_pos}")
        device = context_features.device
        anchors = torch.tensor([[anchor_pos]], device=device)
        tokens = torch.tensor([[anchor_token]], device=device)
        # one block: a dense mask is cheap and avoids compiling flex_attention for every context length
        hidden = self(context_features[:, :anchor_pos], tokens, anchors, backend="sdpa")
        return self.lm_head(hidden[0, 0, 1:].to(self.lm_head.weight.dtype)).float()

    @torch.no_grad()
    def draft(self, context_features: torch.Tensor, anchor_token: int, anchor_pos: int) -> torch.Tensor:
        """Greedy block draft: LongTensor [Bs-1], the guesses for positions anchor_pos+1 .. anchor_pos+Bs-1."""
        return self.draft_logits(context_features, anchor_token, anchor_pos).argmax(dim=-1)


def unwrap(model: nn.Module) -> nn.Module:
    """The drafter inside DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model
