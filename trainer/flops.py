"""Model FLOPs of one training step: the target's feature pass, the drafter's forward and backward, and the
LM head's logits with their backward.

Only matrix products are counted (norms, RoPE, softmax and the optimizer are a rounding error next to them),
at 2 FLOPs per multiply-add. Only useful work counts: real (unpadded) tokens of the target, real blocks of
the drafter, and only the attention pairs a mask lets through (causal for the target; for a drafter block,
the context before its anchor plus its own slots). Padding a kernel computes anyway lowers the utilisation,
as it should.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
class StepFlops:
    target: int              # feature pass (forward only, layers up to the last tap)
    drafter_forward: int     # fc + decoder layers
    drafter_backward: int
    lm_head_forward: int     # logits of slots 1..B-1
    lm_head_backward: int    # gradient of the hidden states only (the head is frozen)

    @property
    def drafter_total(self) -> int:
        return self.drafter_forward + self.drafter_backward + self.lm_head_forward + self.lm_head_backward

    @property
    def total(self) -> int:
        return self.target + self.drafter_total

    def __add__(self, other: "StepFlops") -> "StepFlops":
        return StepFlops(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    def as_dict(self) -> dict:
        return {**asdict(self), "drafter_total": self.drafter_total, "total": self.total}


def target_feature_flops(shape: LayerShape, *, num_layers: int, lengths: list[int]) -> int:
    """Forward FLOPs of `num_layers` causal decoder layers over sequences of the given real lengths."""
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    per_layer = tokens * (shape.query_side_flops() + shape.key_side_flops()) + pairs * shape.attention_pair_flops()
    return num_layers * per_layer


def drafter_step_flops(shape: LayerShape, *, num_layers: int, num_taps: int, block_size: int,
                       context_lengths: list[int], anchors: list[list[int]]) -> StepFlops:
    """FLOPs of one drafter training step (target excluded) for the real blocks `anchors[i]` of sequence i
    (negative entries are padding and do not count) over contexts of the given real lengths."""
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
    # backward: input and weight gradients for every layer (2x), only the weight gradient for fc (its input,
    # the target's features, needs none), only the input gradient for the frozen LM head
    return StepFlops(target=0, drafter_forward=fc + layers, drafter_backward=fc + 2 * layers,
                     lm_head_forward=logits, lm_head_backward=logits)


def training_step_flops(target_shape: LayerShape, drafter_shape: LayerShape, *, target_layers: int,
                        drafter_layers: int, num_taps: int, block_size: int, lengths: list[int],
                        anchors: list[list[int]]) -> StepFlops:
    """Every model FLOP of one step: the target's features plus the drafter's step."""
    target = target_feature_flops(target_shape, num_layers=target_layers, lengths=lengths)
    drafter = drafter_step_flops(drafter_shape, num_layers=drafter_layers, num_taps=num_taps,
                                 block_size=block_size, context_lengths=lengths, anchors=anchors)
    return StepFlops(target=target, drafter_forward=drafter.drafter_forward,
                     drafter_backward=drafter.drafter_backward, lm_head_forward=drafter.lm_head_forward,
                     lm_head_backward=drafter.lm_head_backward)
