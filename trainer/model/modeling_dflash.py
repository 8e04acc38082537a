"""DFlash drafter modeling: the layers the trainer trains, and `DFlashDraftModel` / `DFlash2DraftModel`, the same
layers as transformers models.

Every checkpoint ships this file verbatim as `dflash.py` with `auto_map: {"AutoModel": "dflash.DFlashDraftModel"}`
(or `dflash.DFlash2DraftModel`) in its config.json, so `AutoModel.from_pretrained(checkpoint, trust_remote_code=True)` runs the very code the
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


class BlockConv(nn.Module):
    """DFlash2's dynamic depthwise convolution over the slots of each block, around one sublayer.

    Conv(y)_t = sum_j k_{t,j} * y_{t-j} over slots t-j of the same block (before slot 0 there is nothing): the
    kernel of each side (0: the sublayer's input, 1: its output) is a static per-channel `base_kernel` [2, taps,
    H] plus a correction that `kernel_projection` computes from the normed sublayer input, one value per group of
    `group_size` channels. It starts as the identity (tap 0 one, the rest and the correction zero), so a fresh
    DFlash2 drafter computes what a DFlash one does."""

    def __init__(self, hidden_size: int, *, kernel_size: int, group_size: int, block_size: int):
        super().__init__()
        self.kernel_size, self.group_size, self.block_size = kernel_size, group_size, block_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_identity()

    def reset_identity(self) -> None:
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def kernels(self, normed: torch.Tensor) -> torch.Tensor:
        """[B, Q, H] normed sublayer input -> the dynamic corrections [B, A, Bs, 2, taps, groups]."""
        batch, q_len = normed.shape[:2]
        return self.kernel_projection(normed).view(batch, q_len // self.block_size, self.block_size, 2,
                                                   self.kernel_size, self.groups)

    def forward(self, y: torch.Tensor, kernels: torch.Tensor, side: int) -> torch.Tensor:
        """y [B, Q, H] (Q = A*Bs) through side `side`'s kernel; slots never see another block or a later slot."""
        return block_conv(y, kernels, self.base_kernel, side=side, block_size=self.block_size)


def block_conv(y: torch.Tensor, kernels: torch.Tensor, base_kernel: torch.Tensor, *, side: int,
               block_size: int) -> torch.Tensor:
    """BlockConv's arithmetic as a pure function: y [B, Q, H], the dynamic corrections `kernels` [B, A, Bs, 2,
    taps, groups], `base_kernel` [2, taps, H]; side 0 or 1 (side_conv does the work)."""
    return side_conv(y, kernels[:, :, :, side], base_kernel[side], block_size=block_size)


def side_conv(y: torch.Tensor, kernels: torch.Tensor, base: torch.Tensor, *, block_size: int) -> torch.Tensor:
    """One side of a BlockConv (the trainer compiles it on a GPU, one graph for both sides: trainer/model/
    kernels.py): y [B, Q, H], that side's corrections `kernels` [B, A, Bs, taps, groups] and kernel `base` [taps, H]."""
    batch, q_len, hidden = y.shape
    taps, groups = kernels.shape[-2:]
    blocks = y.view(batch, q_len // block_size, block_size, groups, hidden // groups)
    base = base.view(taps, groups, hidden // groups)
    out = None
    for tap in range(taps):
        coefficient = (kernels[:, :, :, tap, :, None] + base[tap]).to(y.dtype)
        # slot t reads slot t - tap of its own block: a shift along the slot axis, zeros in front
        shifted = F.pad(blocks[:, :, :block_size - tap], (0, 0, 0, 0, tap, 0)) if tap else blocks
        term = coefficient * shifted
        out = term if out is None else out + term
    return out.view(batch, q_len, hidden)


class DrafterLayer(nn.Module):
    """A Qwen3 decoder layer; with `conv` (a DFlash2 drafter: kernel_size, group_size, block_size) each sublayer's
    input and output also pass a BlockConv."""

    def __init__(self, config, layer_type: str, conv: dict | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, layer_type)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DrafterMLP(config)
        if conv is not None:
            self.attention_conv = BlockConv(config.hidden_size, **conv)
            self.mlp_conv = BlockConv(config.hidden_size, **conv)

    def forward(self, x, context, rope_q, rope_kv, mask) -> torch.Tensor:
        if not hasattr(self, "attention_conv"):
            x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_kv, mask)
            return x + self.mlp(self.post_attention_layernorm(x))
        normed = self.input_layernorm(x)
        kernels = self.attention_conv.kernels(normed)
        attended = self.self_attn(self.attention_conv(normed, kernels, 0), context, rope_q, rope_kv, mask)
        x = x + self.attention_conv(attended, kernels, 1)
        normed = self.post_attention_layernorm(x)
        kernels = self.mlp_conv.kernels(normed)
        return x + self.mlp_conv(self.mlp(self.mlp_conv(normed, kernels, 0)), kernels, 1)


class CandidateSelector(nn.Module):
    """DFlash2's path selector: at slot t, candidate b after candidate a scores
    S_t(a, b) = U_t(b) + <A(a) * H(h_t), B(b)>, U the drafter's logit, h_t the slot's final hidden state, A and B
    rank-r codebooks over the vocabulary (`predecessor_codebook`, `successor_codebook`), H `hidden_projection`."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))

    def pair_scores(self, hidden: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor,
                    unary: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], previous [..., P] and candidates [..., K] token ids, unary [..., K] -> [..., P, K]."""
        gate = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        before = self.predecessor_codebook[previous] * gate[..., None, :]
        after = self.successor_codebook[candidates]
        return unary[..., None, :].float() + (before @ after.transpose(-1, -2)).float()

    def block_scores(self, hidden: torch.Tensor, anchor: torch.Tensor, candidates: torch.Tensor,
                     unary: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For the drafted slots of N blocks (hidden [N, T, H], candidates and unary [N, T, K], anchor [N]): the
        first slot's scores after the anchor [N, K] and every later slot's pair scores [N, T-1, K, K]."""
        first = self.pair_scores(hidden[:, 0], anchor[:, None], candidates[:, 0], unary[:, 0])[:, 0]
        later = self.pair_scores(hidden[:, 1:], candidates[:, :-1], candidates[:, 1:], unary[:, 1:])
        return first, later


def viterbi_path(first: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """The candidate index per slot [N, T] of the chain with the highest summed score (first [N, K], later
    [N, T-1, K, K] from CandidateSelector.block_scores)."""
    best, pointers = first, []
    for step in range(later.shape[1]):
        best, pointer = (best[:, :, None] + later[:, step]).max(dim=1)
        pointers.append(pointer)
    index = best.argmax(dim=-1)
    path = [index]
    for pointer in reversed(pointers):
        index = pointer.gather(1, index[:, None])[:, 0]
        path.append(index)
    return torch.stack(path[::-1], dim=1)


def block_input_ids(anchor_tokens: torch.Tensor, *, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[B, A] anchor tokens -> [B, A*Bs]: the anchor's token in slot 0, the mask token in slots 1..Bs-1."""
    tokens = torch.full((*anchor_tokens.shape, block_size), mask_token_id, dtype=torch.long,
                        device=anchor_tokens.device)
    tokens[..., 0] = anchor_tokens
    return tokens.flatten(1)


# what a DFlash2 checkpoint's dflash_config adds to DFlash's (mask_token_id, target_layer_ids)
DFLASH2_KEYS = ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


class DFlashBlocks:
    """The drafter's modules and forward, shared by the trainer's drafter and the transformers models (a mixin of
    nn.Module subclasses: the tensor names are DFLASH.md's, `fc`, `hidden_norm`, `layers.{i}`, `norm`; DFlash2
    adds `layers.{i}.attention_conv`, `layers.{i}.mlp_conv` and `candidate_selector`)."""

    def build_blocks(self, config, *, layer_types: list[str], num_taps: int, rope_theta: float,
                     dflash2: dict | None = None) -> None:
        """dflash2: the DFLASH2_KEYS sizes of a DFlash2 drafter (None: DFlash)."""
        self.fc = nn.Linear(num_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        conv = None if dflash2 is None else {"kernel_size": dflash2["conv_kernel_size"],
                                             "group_size": dflash2["conv_group_size"],
                                             "block_size": dflash2["block_size"]}
        self.layers = nn.ModuleList(DrafterLayer(config, t, conv) for t in layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, rope_theta)
        self.selector_top_k = None if dflash2 is None else int(dflash2["selector_top_k"])
        if dflash2 is not None:
            self.candidate_selector = CandidateSelector(config.hidden_size, config.vocab_size,
                                                        dflash2["selector_rank"])

    def init_dflash2(self, module: nn.Module, std: float) -> None:
        """Initialise DFlash2's modules (for `self.apply`, which reaches a module after its children)."""
        if isinstance(module, BlockConv):
            module.reset_identity()
        elif isinstance(module, CandidateSelector):
            nn.init.normal_(module.predecessor_codebook, std=std)
            nn.init.normal_(module.successor_codebook, std=std)

    def chain_from_logits(self, logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """The drafted chain [N, T] from the drafted slots' logits [N, T, V] and final hidden states [N, T, H] of
        N blocks, anchor tokens [N]: DFlash takes each slot's top-1, DFlash2 the selector's best path through each
        slot's top `selector_top_k` candidates."""
        if self.selector_top_k is None:
            return logits.argmax(dim=-1)
        unary, candidates = logits.topk(min(self.selector_top_k, logits.shape[-1]), dim=-1)
        return self.chain_from_candidates(unary, candidates, hidden, anchor)

    def chain_from_candidates(self, unary: torch.Tensor, candidates: torch.Tensor, hidden: torch.Tensor,
                              anchor: torch.Tensor) -> torch.Tensor:
        """DFlash2's chain [N, T] from each slot's candidates [N, T, K] and their logits [N, T, K]."""
        first, later = self.candidate_selector.block_scores(hidden, anchor, candidates, unary)
        return candidates.gather(-1, viterbi_path(first, later)[..., None])[..., 0]

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
                          rope_theta=rope_theta_of(config), dflash2=self.dflash2_sizes(config))
        self.post_init()

    def dflash2_sizes(self, config) -> dict | None:
        return None

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        self.init_dflash2(module, self.config.initializer_range)

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


class DFlash2DraftModel(DFlashDraftModel):
    """A DFlash2 drafter as a transformers model: DFlash's layers with a BlockConv around each sublayer, and the
    candidate selector (`chain_from_logits` gives the drafted chain from the target LM head's logits). Its sizes
    are dflash_config's DFLASH2_KEYS."""

    def dflash2_sizes(self, config) -> dict:
        sizes = {key: config.dflash_config[key] for key in DFLASH2_KEYS}
        self.block_size = int(sizes["block_size"])
        return sizes
