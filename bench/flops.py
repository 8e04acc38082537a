"""Model FLOPs of one training step: the target's feature pass, the drafter's forward and backward, and the
LM head's logits with their backward; for an objective against the target's distribution (kl, tv, nla,
lk_hybrid), also the target's layers past the last tap and its LM head at the slots' positions.

Only matrix products are counted (norms, RoPE, softmax and the optimizer are a rounding error next to them),
at 2 FLOPs per multiply-add. A hybrid target's Gated DeltaNet layer counts its projections (in_proj_qkv, z, b, a,
out_proj), its depthwise causal conv1d (2 * channels * kernel per token) and the gated delta rule itself: per
token and value head, 6 * dk * dv for the three products with the dk x dv recurrent state (read for the output,
read for the delta, rank-1 write) plus (C + 1) * (dk + dv) for the causal attention inside each chunk of C = 64
tokens (on average (C + 1) / 2 earlier tokens of the chunk, a q.k and an a.v each). An MoE MLP counts the experts
a token is routed to, the shared expert and the router. Only useful work counts: real (unpadded) tokens of the target, real blocks of
the drafter, and only the attention pairs a mask lets through (causal for the target; for a drafter block,
the context before its anchor plus its own slots). Padding a kernel computes anyway lowers the utilisation,
as it should.

A DFlash2 drafter adds, per block slot and layer, its two convolutions' kernel projections (their elementwise
products are not matrix products), and per drafted slot its selector's hidden projection and the pair scores of
its K candidates; the selector's backward computes weight gradients only (its inputs are detached). Its
candidates are the top K of the logits the loss computes anyway (no second pass over the LM head).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from trainer.planning.dflash2 import Dflash2Sizes
from trainer.planning.target_families import FULL, LINEAR, SLIDING, target_spec

GDN_CHUNK = 64  # the chunk length of the chunked gated-delta-rule kernels (fla's and transformers')


@dataclass(frozen=True)
class LayerShape:
    """The sizes of a Qwen3-style decoder layer (an HF config and a DrafterConfig both provide them)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_config(cls, config) -> "LayerShape":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
                   num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
                   intermediate_size=config.intermediate_size, vocab_size=config.vocab_size)

    def query_side_flops(self) -> int:
        """Forward FLOPs per query token of q_proj, o_proj and the SwiGLU MLP."""
        h, q_width = self.hidden_size, self.num_heads * self.head_dim
        return 2 * h * q_width * 2 + 2 * h * self.intermediate_size * 3

    def key_side_flops(self) -> int:
        """Forward FLOPs per key/value token of k_proj and v_proj."""
        return 2 * self.hidden_size * self.num_kv_heads * self.head_dim * 2

    def attention_pair_flops(self) -> int:
        """Forward FLOPs per (query, key) pair that the mask lets through: q.k and p.v for every head."""
        return 4 * self.num_heads * self.head_dim


@dataclass(frozen=True)
class LinearShape:
    """A Gated DeltaNet layer's sizes."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    def token_flops(self, hidden_size: int) -> int:
        key_dim, value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        conv_dim = 2 * key_dim + value_dim
        projections = 2 * hidden_size * (conv_dim + value_dim + 2 * self.num_v_heads) + 2 * value_dim * hidden_size
        dk, dv = self.head_k_dim, self.head_v_dim
        delta_rule = self.num_v_heads * (6 * dk * dv + (GDN_CHUNK + 1) * (dk + dv))
        return projections + 2 * conv_dim * self.conv_kernel + delta_rule


def _mlp_token_flops(text: dict, hidden: int) -> int:
    experts = text.get("num_experts") or 0
    if experts and text.get("moe_intermediate_size"):
        routed = int(text["num_experts_per_tok"]) * 6 * hidden * int(text["moe_intermediate_size"])
        shared = int(text.get("shared_expert_intermediate_size") or 0)
        shared_flops = 6 * hidden * shared + (2 * hidden if shared else 0)  # the shared expert and its gate
        return routed + shared_flops + 2 * hidden * int(experts)
    return 6 * hidden * int(text["intermediate_size"])


@dataclass(frozen=True)
class TargetShape:
    """A target's forward costs per layer type: attention layers (full or sliding), linear-attention layers."""

    attention: LayerShape          # the attention layers' sizes (their intermediate_size is not read)
    layer_types: tuple[str, ...]
    mlp_flops: int                 # per token, every layer
    gated_query: bool = False      # Qwen3.5: q_proj also produces the output gate, twice as wide
    linear: LinearShape | None = None
    window: int | None = None

    @classmethod
    def from_config(cls, config) -> "TargetShape":
        """From an HF config object or a config.json mapping (a composite one's text_config is used)."""
        spec = target_spec(config if isinstance(config, dict) else config.to_dict())
        text = spec.text
        hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
        attention = LayerShape(hidden_size=hidden, num_heads=heads,
                               num_kv_heads=int(text.get("num_key_value_heads") or heads),
                               head_dim=int(text.get("head_dim") or hidden // heads),
                               intermediate_size=int(text.get("intermediate_size") or 0),
                               vocab_size=int(text["vocab_size"]))
        linear = None
        if LINEAR in spec.layer_types:
            linear = LinearShape(num_k_heads=int(text["linear_num_key_heads"]),
                                 num_v_heads=int(text["linear_num_value_heads"]),
                                 head_k_dim=int(text["linear_key_head_dim"]),
                                 head_v_dim=int(text["linear_value_head_dim"]),
                                 conv_kernel=int(text["linear_conv_kernel_dim"]))
        return cls(attention=attention, layer_types=spec.layer_types, mlp_flops=_mlp_token_flops(text, hidden),
                   gated_query=spec.family == "qwen3_5", linear=linear,
                   window=text.get("sliding_window") if SLIDING in spec.layer_types else None)

    @classmethod
    def dense(cls, shape: LayerShape, num_layers: int) -> "TargetShape":
        return cls(attention=shape, layer_types=(FULL,) * num_layers,
                   mlp_flops=6 * shape.hidden_size * shape.intermediate_size)

    def token_flops(self, layer_type: str) -> int:
        """Forward FLOPs per token of one layer of `layer_type`, attention pairs excluded."""
        a = self.attention
        if layer_type == LINEAR:
            return self.linear.token_flops(a.hidden_size) + self.mlp_flops
        q_width = a.num_heads * a.head_dim
        q_proj = 2 * a.hidden_size * q_width * (2 if self.gated_query else 1)
        return q_proj + 2 * q_width * a.hidden_size + a.key_side_flops() + self.mlp_flops

    def pairs(self, layer_type: str, length: int) -> int:
        """(query, key) pairs the layer's mask lets through in a causal sequence of `length`."""
        if layer_type == LINEAR:
            return 0
        if layer_type == SLIDING and self.window:
            w = min(self.window, length)
            return w * (w + 1) // 2 + (length - w) * w
        return length * (length + 1) // 2

    def feature_flops(self, *, num_layers: int, lengths: list[int]) -> int:
        """Forward FLOPs of the first `num_layers` layers over sequences of the given real lengths."""
        tokens = sum(lengths)
        pair_flops = self.attention.attention_pair_flops()
        return sum(tokens * self.token_flops(kind) + pair_flops * sum(self.pairs(kind, n) for n in lengths)
                   for kind in self.layer_types[:num_layers])


@dataclass(frozen=True)
class StepFlops:
    target: int              # feature pass (forward only, layers up to the last tap)
    drafter_forward: int     # fc + decoder layers
    drafter_backward: int
    lm_head_forward: int     # logits of slots 1..B-1
    lm_head_backward: int    # gradient of the hidden states only (the head is frozen)
    # objectives against the target's distribution (kl, tv, nla, lk_hybrid): its layers past the last tap and
    # its LM head at every slot's position, forward only
    target_distribution: int = 0

    @property
    def drafter_total(self) -> int:
        return self.drafter_forward + self.drafter_backward + self.lm_head_forward + self.lm_head_backward

    @property
    def total(self) -> int:
        return self.target + self.target_distribution + self.drafter_total

    def __add__(self, other: "StepFlops") -> "StepFlops":
        return StepFlops(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    def as_dict(self) -> dict:
        return {**asdict(self), "drafter_total": self.drafter_total, "total": self.total}


def target_feature_flops(shape: LayerShape | TargetShape, *, num_layers: int, lengths: list[int]) -> int:
    """Forward FLOPs of the target's first `num_layers` layers (a LayerShape: dense causal layers) over
    sequences of the given real lengths."""
    if isinstance(shape, LayerShape):
        shape = TargetShape.dense(shape, num_layers)
    return shape.feature_flops(num_layers=num_layers, lengths=lengths)


def dflash2_flops(sizes: Dflash2Sizes, hidden_size: int, *, num_layers: int, slots: int,
                  drafted: int) -> tuple[int, int]:
    """(forward, backward) FLOPs DFlash2 adds over `slots` block slots of which `drafted` are drafted."""
    h = hidden_size
    conv = num_layers * slots * 2 * 2 * h * (2 * sizes.conv_kernel_size * h // sizes.conv_group_size)
    selector = drafted * (2 * h * sizes.selector_rank + 2 * sizes.selector_top_k * sizes.selector_rank)
    return conv + selector, 2 * conv + selector


def drafter_step_flops(shape: LayerShape, *, num_layers: int, num_taps: int, block_size: int,
                       context_lengths: list[int], anchors: list[list[int]],
                       dflash2: Dflash2Sizes | None = None) -> StepFlops:
    """FLOPs of one drafter training step (target excluded) for the real blocks `anchors[i]` of sequence i
    (negative entries are padding and do not count) over contexts of the given real lengths; `dflash2`: the
    sizes of a DFlash2 drafter's convolutions and selector."""
    blocks = [a for row in anchors for a in row if a >= 0]
    slots = len(blocks) * block_size
    context_tokens = sum(context_lengths)
    h = shape.hidden_size
    fc = 2 * num_taps * h * h * context_tokens
    pairs = sum(block_size * (anchor + block_size) for anchor in blocks)
    per_layer = (slots * shape.query_side_flops() + (context_tokens + slots) * shape.key_side_flops()
                 + pairs * shape.attention_pair_flops())
    layers = num_layers * per_layer
    logits = 2 * h * shape.vocab_size * len(blocks) * (block_size - 1)
    extra_forward, extra_backward = (0, 0) if dflash2 is None else dflash2_flops(
        dflash2, h, num_layers=num_layers, slots=slots, drafted=len(blocks) * (block_size - 1))
    # backward: input and weight gradients for every layer (2x), only the weight gradient for fc (its input,
    # the target's features, needs none), only the input gradient for the frozen LM head
    return StepFlops(target=0, drafter_forward=fc + layers + extra_forward,
                     drafter_backward=fc + 2 * layers + extra_backward, lm_head_forward=logits,
                     lm_head_backward=logits)


def target_distribution_flops(target_shape: LayerShape | TargetShape, *, target_layers: int, total_layers: int,
                              block_size: int, lengths: list[int], anchors: list[list[int]]) -> int:
    """What an objective against the target's distribution adds: the layers after the first `target_layers` over
    every real token (they need the whole context) and the LM head at the B-1 slot positions of each real block."""
    if isinstance(target_shape, LayerShape):
        target_shape = TargetShape.dense(target_shape, total_layers)
    shape = target_shape.attention
    layers = (target_shape.feature_flops(num_layers=total_layers, lengths=lengths)
              - target_shape.feature_flops(num_layers=target_layers, lengths=lengths))
    blocks = sum(1 for row in anchors for a in row if a >= 0)
    return layers + 2 * shape.hidden_size * shape.vocab_size * blocks * (block_size - 1)


def training_step_flops(target_shape: LayerShape | TargetShape, drafter_shape: LayerShape, *, target_layers: int,
                        drafter_layers: int, num_taps: int, block_size: int, lengths: list[int],
                        anchors: list[list[int]], dflash2: Dflash2Sizes | None = None,
                        total_layers: int | None = None) -> StepFlops:
    """Every model FLOP of one step: the target's features plus the drafter's step; with `total_layers` (an
    objective against the target's distribution), also the target's remaining layers and its LM head."""
    target = target_feature_flops(target_shape, num_layers=target_layers, lengths=lengths)
    drafter = drafter_step_flops(drafter_shape, num_layers=drafter_layers, num_taps=num_taps,
                                 block_size=block_size, context_lengths=lengths, anchors=anchors, dflash2=dflash2)
    distribution = 0 if total_layers is None else target_distribution_flops(
        target_shape, target_layers=target_layers, total_layers=total_layers, block_size=block_size,
        lengths=lengths, anchors=anchors)
    return StepFlops(target=target, drafter_forward=drafter.drafter_forward,
                     drafter_backward=drafter.drafter_backward, lm_head_forward=drafter.lm_head_forward,
                     lm_head_backward=drafter.lm_head_backward, target_distribution=distribution)
