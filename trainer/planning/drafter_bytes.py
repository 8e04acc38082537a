"""What one drafter step keeps on the device, from the drafter's shape alone (torch-free): its parameters, the
byte sizes of the run, and what autograd saves for backward per block token and per key/value token, with the
drafter's own torch code or with liger-kernel's fused RMSNorm and SwiGLU (trainer/model/kernels.py swaps them in).

On the CPU each figure equals what saved-tensor hooks count in a real step (tests/trainer/planning/test_memory_plan.py;
the liger path with stand-in Functions that save what liger-kernel 0.8.5's save)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from trainer.planning.dflash2 import ARCHITECTURE_NAMES, Dflash2Sizes
from trainer.planning.target_families import TargetSpec, drafter_shape

FP32 = 4
KERNELS = ("torch", "liger")     # what the drafter's RMSNorm and SwiGLU run (kernels.resolve's answers)


@dataclass(frozen=True)
class DrafterSizes:
    """The drafter's shape as the plan needs it (a DrafterConfig or its config.json provide these fields)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_taps: int
    block_size: int
    vocab_size: int = 0                    # read only by a DFlash2 drafter's selector codebooks
    dflash2: Dflash2Sizes | None = None    # a DFlash2 drafter's convolution and selector

    @classmethod
    def from_drafter_config(cls, data: dict) -> "DrafterSizes":
        """From a drafter checkpoint's config.json (what a resumed run rebuilds)."""
        nested = data["dflash_config"]
        dflash2 = data.get("architectures") == [ARCHITECTURE_NAMES["dflash2"]]
        return cls(hidden_size=data["hidden_size"], num_layers=data["num_hidden_layers"],
                   num_heads=data["num_attention_heads"], num_kv_heads=data["num_key_value_heads"],
                   head_dim=data["head_dim"], intermediate_size=data["intermediate_size"],
                   num_taps=len(nested["target_layer_ids"]), block_size=data.get("block_size", nested.get("block_size")),
                   vocab_size=data["vocab_size"] if dflash2 else 0,
                   dflash2=Dflash2Sizes.from_mapping(nested) if dflash2 else None)

    @classmethod
    def for_run(cls, spec: TargetSpec, cfg, *, num_taps: int) -> "DrafterSizes":
        """The drafter a fresh run of `cfg` builds for this target: the family's recipe with the config's
        drafter_* keys over it (target_families.drafter_shape, as train.py builds it)."""
        shape = drafter_shape(spec, heads=cfg.drafter_heads, kv_heads=cfg.drafter_kv_heads,
                              head_dim=cfg.drafter_head_dim, intermediate_size=cfg.drafter_intermediate_size,
                              sliding_window=cfg.sliding_window, rope_theta=cfg.drafter_rope_theta)
        dflash2 = getattr(cfg, "architecture", "dflash") == "dflash2"
        return cls(hidden_size=spec.hidden_size, num_layers=cfg.drafter_layers, num_heads=shape.num_heads,
                   num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                   intermediate_size=shape.intermediate_size, num_taps=num_taps, block_size=cfg.block_size,
                   vocab_size=int(spec.text.get("vocab_size") or 0) if dflash2 else 0,
                   dflash2=Dflash2Sizes.from_mapping(cfg) if dflash2 else None)

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def param_numels(self) -> list[int]:
        """Trainable parameter sizes in DFlashDrafter.parameters() order (embedding and LM head are the
        target's): fc, hidden_norm, per layer (input norm, q, k, v, o, q_norm, k_norm, post norm, gate, up,
        down; DFlash2: its two convolutions), final norm (DFlash2: then the selector)."""
        h, q, kv, inter = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        layer = [h, q * h, kv * h, kv * h, h * q, self.head_dim, self.head_dim, h, inter * h, inter * h, h * inter]
        if self.dflash2 is None:
            return [self.num_taps * h * h, h, *layer * self.num_layers, h]
        layer += self.dflash2.layer_param_numels(h)
        return [self.num_taps * h * h, h, *layer * self.num_layers, h,
                *self.dflash2.selector_param_numels(h, self.vocab_size)]

    def matmul_params(self) -> int:
        """Parameters of the drafter's linear layers: the ones autocast copies to bf16 every step (DFlash2's
        codebooks are indexed, not multiplied, and its base kernels are elementwise)."""
        dflash = replace(self, dflash2=None).param_numels()
        linear = sum(n for n in dflash if n > max(self.hidden_size, self.head_dim))
        if self.dflash2 is None:
            return linear
        conv = self.dflash2.layer_param_numels(self.hidden_size)
        return linear + self.num_layers * (conv[1] + conv[3]) + self.dflash2.selector_param_numels(
            self.hidden_size, self.vocab_size)[2]


@dataclass(frozen=True)
class Precision:
    """Byte sizes of a run: the target's weights, the drafter's activations (autocast dtype), and whether
    autocast makes low-precision copies (of the weights and of each linear layer's input)."""

    target: int
    act: int
    casts: bool

    @classmethod
    def of_run(cls, dtype: str, on_gpu: bool) -> "Precision":
        size = {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype, 2 if on_gpu else 4)
        return cls(target=size, act=size if on_gpu else FP32, casts=on_gpu and size < FP32)


def norm_saved_bytes(width: int, p: Precision, kernels: str = "torch") -> int:
    """What one RMSNorm keeps per row of `width`. torch: an fp32 copy of its input, the fp32 rstd and the
    normalised value in the input's dtype (the autocast dtype: the residual stream stays in it). liger:
    LigerRMSNormFunction keeps its input X as it is and RSTD (fp32, one per row); W is the parameter."""
    if kernels == "liger":
        return p.act * width + FP32
    return (FP32 + p.act) * width + FP32


def saved_bytes_per_layer(d: DrafterSizes, p: Precision, kernels: str = "torch") -> tuple[int, int]:
    """What autograd keeps of one drafter layer, in bytes (per block token, per key/value token).

    Two RMSNorms per block token; the linear layers' inputs in the autocast dtype (q_proj's, and one shared by
    gate_proj and up_proj: the norms already return that dtype, so autocast makes no copies); attention keeps q
    and k after RoPE, v, its output and fp32 log-sum-exp; down_proj its input. Per key, k_proj and v_proj share
    the saved [context; block] input. q_norm / k_norm: torch keeps an fp32 copy of the projection's output and
    the normalised value, liger the projection's output and an fp32 rstd per head. The SwiGLU: torch keeps gate,
    silu(gate) and up; liger's LigerSiLUMulFunction gate and up (it recomputes silu in backward)."""
    a, f, liger = p.act, FP32, kernels == "liger"
    head_norm = a if liger else f + a
    swiglu = 2 if liger else 3
    per_query = (2 * norm_saved_bytes(d.hidden_size, p, kernels) + 2 * a * d.hidden_size
                 + (head_norm + 2 * a) * d.q_width + 2 * f * d.num_heads + (swiglu + 1) * a * d.intermediate_size)
    if d.dflash2 is not None:
        per_query += d.dflash2.saved_bytes_per_query(d.hidden_size, a)
    per_key = a * d.hidden_size + (head_norm + 2 * a) * d.kv_width + f * d.num_kv_heads
    return per_query, per_key


def drafter_saved_bytes(d: DrafterSizes, p: Precision, *, context_tokens: int, block_tokens: int,
                        kernels: str = "torch") -> int:
    """Everything autograd keeps for one drafter step (weights and the target's features excepted: under autocast
    fc reads the features as they are), with the drafter's torch code or liger's kernels.

    Around the layers: hidden_norm per context token; per block token the token id, the RoPE tables (in the
    autocast dtype; also per key), the final norm and the loss's gradient of the hidden states of slots 1..B-1."""
    per_query, per_key = saved_bytes_per_layer(d, p, kernels)
    keys = context_tokens + block_tokens
    norm = norm_saved_bytes(d.hidden_size, p, kernels)
    layers = d.num_layers * (per_query * block_tokens + per_key * keys)
    supervised = block_tokens * (d.block_size - 1) // d.block_size
    blocks = (block_tokens * (8 + 2 * p.act * d.head_dim + norm)
              + keys * 2 * p.act * d.head_dim + supervised * p.act * d.hidden_size)
    if d.dflash2 is not None:
        blocks += supervised * d.dflash2.saved_bytes_per_slot(p.act)
    return layers + context_tokens * norm + blocks


def backward_working_bytes(d: DrafterSizes, p: Precision, *, context_tokens: int, block_tokens: int,
                           kernels: str = "torch") -> int:
    """The most the backward holds at once above what the forward saved (the weights' gradients apart: the plan
    counts them whole), in bytes.

    torch: the larger of the final RMSNorm's backward (five fp32 [block tokens, hidden] temporaries at once) and
    the last layer's SwiGLU backward (the gradients of silu(gate) and of up, [block tokens, intermediate] in the
    autocast dtype, once down_proj's input is freed; and the residual stream's), plus one MLP weight's gradient (in the autocast dtype and its fp32 copy). On the CPU the
    backward's peak over the forward's live tensors stays under this and above half of it (tests).
    liger: its kernels' backward cannot run here to be measured; one layer's saved tensors, the allowance the
    H200 measurements were taken against (the 27B hybrid's plan is 3 % above its measured peak)."""
    if kernels == "liger":
        per_query, per_key = saved_bytes_per_layer(d, p, kernels)
        return per_query * block_tokens + per_key * (context_tokens + block_tokens)
    norm = 5 * FP32 * d.hidden_size
    swiglu = 2 * p.act * d.intermediate_size + p.act * d.hidden_size
    return max(norm, swiglu) * block_tokens + (p.act + FP32) * d.hidden_size * d.intermediate_size
