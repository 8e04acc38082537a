"""The DFlash drafter: Qwen3-style decoder layers whose keys/values also carry the target's context features.

Its config (DrafterConfig, what config.json holds) and the trainer's module around the layers; the layers and the
forward themselves are trainer/model/modeling_dflash.py's, the file every checkpoint ships."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from trainer.model.masks import build_drafter_mask, choose_backend
from trainer.model.modeling_dflash import (  # noqa: F401  (the layers are importable from here too)
    DFLASH2_KEYS, FULL_ATTENTION, SLIDING_ATTENTION, DFlashBlocks, DrafterLayer, DrafterMLP, RMSNorm,
    RotaryEmbedding, block_input_ids)
from trainer.planning.dflash2 import ARCHITECTURE_NAMES, Dflash2Sizes
from trainer.planning.target_families import DrafterShape, drafter_shape, target_spec


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
    dflash2: Dflash2Sizes | None = None   # a DFlash2 drafter's convolution and selector sizes; None: DFlash

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
                    layer_types: list[str] | None = None, dflash2: Dflash2Sizes | None = None) -> "DrafterConfig":
        """Hidden size and vocabulary follow the target (an HF text config); heads, head size, MLP width, window
        and RoPE base come from `shape` (default: the target family's recipe, target_families.recipe_shape), with
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
            dflash2=dflash2,
        )

    @property
    def architecture(self) -> str:
        return "dflash" if self.dflash2 is None else "dflash2"

    def dflash2_sizes(self) -> dict | None:
        """The DFLASH2_KEYS sizes the modeling file builds a DFlash2 drafter from (None: DFlash)."""
        return None if self.dflash2 is None else {"block_size": self.block_size, **asdict(self.dflash2)}

    def to_hf_dict(self) -> dict:
        """config.json as SGLang and vLLM read a DFlash drafter."""
        out = {
            "architectures": [ARCHITECTURE_NAMES[self.architecture]],
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
        out["dflash_config"] = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids,
                                **(self.dflash2_sizes() or {})}
        # vLLM's name for the taps, counted from the embedding output (layer i's output is hidden state i + 1);
        # releases without a fallback to dflash_config would otherwise tap 3 default layers
        out["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in self.target_layer_ids]
        out["layer_types"] = self.resolved_layer_types
        out["use_sliding_window"] = self.sliding_window is not None
        out["sliding_window"] = self.sliding_window
        out.update(self.extra)
        return out

    @classmethod
    def from_hf_dict(cls, data: dict) -> "DrafterConfig":
        known = {f for f in cls.__dataclass_fields__
                 if f not in ("extra", "mask_token_id", "target_layer_ids", "dflash2")}
        kwargs = {key: data[key] for key in known if key in data}
        nested = data["dflash_config"]
        if data.get("architectures") == [ARCHITECTURE_NAMES["dflash2"]]:
            kwargs["block_size"] = nested.get("block_size", data.get("block_size"))
            kwargs["dflash2"] = Dflash2Sizes.from_mapping(nested)
        kwargs["mask_token_id"] = data["dflash_config"]["mask_token_id"]
        kwargs["target_layer_ids"] = list(data["dflash_config"]["target_layer_ids"])
        if not data.get("use_sliding_window", data.get("sliding_window") is not None):
            kwargs["sliding_window"], kwargs["layer_types"] = None, None
        kwargs["extra"] = {k: data[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in data}
        return cls(**kwargs)

    def as_dict(self) -> dict:
        return asdict(self)


class DFlashDrafter(DFlashBlocks, nn.Module):
    """The drafter. Its layers and forward are trainer/model/modeling_dflash.py's, the file every checkpoint ships. The
    target's embedding and LM head are used but never registered: they stay frozen and out of state_dict(),
    parameters() and the checkpoint."""

    def __init__(self, config: DrafterConfig, *, embed_tokens: nn.Embedding, lm_head: nn.Linear,
                 attention_backend: str = "auto"):
        super().__init__()
        self.config = config
        self.attention_backend = attention_backend
        self.__dict__["embed_tokens"] = embed_tokens
        self.__dict__["lm_head"] = lm_head
        self.build_blocks(config, layer_types=config.resolved_layer_types, num_taps=len(config.target_layer_ids),
                          rope_theta=config.rope_theta, dflash2=config.dflash2_sizes())
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        self.init_dflash2(module, self.config.initializer_range)

    def block_tokens(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B, A*Bs]: the anchor's real token in slot 0, the mask token in slots 1..Bs-1."""
        return block_input_ids(anchor_tokens, block_size=self.config.block_size,
                               mask_token_id=self.config.mask_token_id)

    def forward(self, features: torch.Tensor, anchor_tokens: torch.Tensor, anchors: torch.Tensor,
                *, backend: str | None = None, layers: list[int] | None = None) -> torch.Tensor:
        """Final-normed hidden states [B, A, Bs, H] of every block slot; anchors [B, A], -1 for padded blocks.

        Apply `lm_head` to slots 1..Bs-1 (objective.py does it in chunks). `layers` runs only those layers (the
        start-up compile warms one layer of each type)."""
        context = self.project_context(features)
        x = self.embed_tokens(self.block_tokens(anchor_tokens))
        mask = build_drafter_mask(
            anchors, context_len=context.shape[1], block_size=self.config.block_size,
            layer_types=self.config.resolved_layer_types, sliding_window=self.config.sliding_window,
            backend=choose_backend(anchors.device, backend or self.attention_backend))
        return self.run_blocks(context, x, anchors, mask, layers=layers)

    @torch.no_grad()
    def chain(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """The drafted chain [N, Bs-1] of N blocks from their final hidden states [N, Bs, H] (slot 0 included)
        and anchor tokens [N]: each slot's top-1 (DFlash), the selector's path (DFlash2)."""
        drafted = hidden[:, 1:]
        logits = self.lm_head(drafted.to(self.lm_head.weight.dtype))
        return self.chain_from_logits(logits, drafted, anchor_tokens)

    @torch.no_grad()
    def candidate_logprobs(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_tokens: torch.Tensor):
        """A DFlash2 drafter's candidates for trees, from the drafted slots' logits [N, T, V] and hidden states
        [N, T, H]: (candidate ids [N, T, K], log-probs of the first slot's candidates after the anchor [N, K],
        log-probs of each later slot's candidates after each of the slot before's [N, T-1, K, K]), each a softmax
        of the selector's pair scores over the K candidates."""
        unary, candidates = logits.topk(min(self.selector_top_k, logits.shape[-1]), dim=-1)
        first, later = self.candidate_selector.block_scores(hidden, anchor_tokens, candidates, unary)
        return candidates, torch.log_softmax(first, dim=-1), torch.log_softmax(later, dim=-1)

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
        """The block's drafted chain: LongTensor [Bs-1], the guesses for positions anchor_pos+1 ..
        anchor_pos+Bs-1; context_features [1, S, k*H] holds the states of positions < anchor."""
        if context_features.shape[1] < anchor_pos:
            raise ValueError(f"context has {context_features.shape[1]} positions, anchor is at {anchor_pos}")
        device = context_features.device
        tokens = torch.tensor([[anchor_token]], device=device)
        hidden = self(context_features[:, :anchor_pos], tokens, torch.tensor([[anchor_pos]], device=device),
                      backend="sdpa")
        return self.chain(hidden[:, 0], tokens[0])[0]


def unwrap(model: nn.Module) -> nn.Module:
    """The drafter inside DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model
