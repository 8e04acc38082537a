"""The frozen target's linear layers in FP8 (config `target_precision: fp8`): E4M3 weights with one scale per
output channel, activations quantized per token as they arrive, the product by `torch._scaled_mm` with those
scales (fp32 accumulation, bf16 out); everything else (norms, attention, rotary, embedding, LM head) stays as it
was. Only the feature pass's cost changes: the target is frozen, nothing flows back through it.

Each scale maps its row's absolute maximum to E4M3's largest value (448), so a row of small activations keeps its
precision beside a row of large ones. Off a GPU (tests) the same quantized operands are multiplied in fp32
(`emulated_matmul`), which is what _scaled_mm computes up to its accumulation order and bf16 rounding.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from trainer.errors import TrainerError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY_AMAX = 1e-12   # a row of zeros gets this scale (and quantizes to zeros) instead of a division by zero
ALIGN = 16          # _scaled_mm wants both dimensions of the weight divisible by 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] -> (E4M3 [rows, k], fp32 scales [rows]) with x ~ q * scale, one scale per row."""
    amax = x.abs().amax(dim=-1).float().clamp(min=TINY_AMAX)
    scale = amax / E4M3_MAX
    q = (x.float() / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def emulated_matmul(q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    out_dtype: torch.dtype) -> torch.Tensor:
    """What _scaled_mm computes, in fp32 on any device: (q * scale) @ (weight * weight_scale).T."""
    return (dequantize(q, scale) @ dequantize(weight, weight_scale).t()).to(out_dtype)


def scaled_matmul(q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """q [M, K] E4M3 (row-major) times weight [N, K] E4M3 (its transpose is the column-major operand), scaled per
    row of q and per row of weight."""
    return torch._scaled_mm(q, weight.t(), scale_a=scale[:, None].contiguous(),
                            scale_b=weight_scale[None, :].contiguous(), out_dtype=out_dtype)


class QuantizeOnce:
    """`quantize` for every Fp8Linear of one target, which remembers its last input: a layer's q, k and v
    projections (and its MLP's gate and up) read the same activations, quantized once for them, not three (two)
    times. The input is known by identity and version (an in-place change makes it new) and held only weakly."""

    def __init__(self, quantize) -> None:
        self.quantize = quantize
        self.last = None   # (weakref to the input, its version, (q, scale))

    def __call__(self, x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():   # a compiled layer (TargetModel.compile_layers): the graph fuses the
            return self.quantize(rows)      # quantization into the op before it and needs no memory of inputs
        if self.last is not None and self.last[0]() is x and self.last[1] == x._version:
            return self.last[2]
        found = self.quantize(rows)
        self.last = (weakref.ref(x), x._version, found)
        return found


class Fp8Linear(nn.Module):
    """An nn.Linear of the frozen target with its weight in E4M3 (buffers: nothing here is trained)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, *, quantize: QuantizeOnce | None = None, matmul=scaled_matmul):
        """weight [out, in] E4M3 with weight_scale [out] (quantize_rows of the float weight); out_dtype: the
        products' (the float layer's dtype)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)
        self.out_dtype = out_dtype
        self.quantize, self.matmul = quantize or QuantizeOnce(quantize_rows), matmul

    @classmethod
    def of(cls, linear: nn.Linear, *, quantize: QuantizeOnce | None = None, matmul=scaled_matmul) -> "Fp8Linear":
        """The FP8 form of a float layer."""
        weight, weight_scale = quantize_rows(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        out_dtype = linear.weight.dtype if linear.weight.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        return cls(weight, weight_scale, bias, out_dtype, quantize=quantize, matmul=matmul)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features)
        q, scale = self.quantize(x, rows)
        out = self.matmul(q, scale, self.weight, self.weight_scale, self.out_dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3"


def convertible(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and module.in_features % ALIGN == 0 and module.out_features % ALIGN == 0


def quantize_linears(layers: nn.Module, *, emulate: bool = False) -> tuple[int, int]:
    """Swap every nn.Linear under `layers` (the target's decoder layers: never its embedding or LM head, which the
    drafter shares) for an Fp8Linear, in place; one whose sizes _scaled_mm cannot take stays as it is. `emulate`:
    multiply in fp32 (any device). Returns (swapped, left)."""
    quantize = quantize_rows
    if not emulate:
        # the per-token quantization is elementwise work over every activation: compiled it is one pass that
        # reads the activations twice (amax, then scale and cast) without an fp32 copy; token counts vary
        quantize = torch.compile(quantize_rows, dynamic=True)
    quantize = QuantizeOnce(quantize)   # one for the whole target: consecutive layers that share an input
    matmul = emulated_matmul if emulate else scaled_matmul
    swapped = left = 0
    for parent in list(layers.modules()):
        for name, child in list(parent.named_children()):
            if convertible(child):
                setattr(parent, name, Fp8Linear.of(child, quantize=quantize, matmul=matmul))
                swapped += 1
            elif isinstance(child, nn.Linear):
                left += 1
    return swapped, left


def probe(device: torch.device) -> None:
    """One small product through _scaled_mm on `device`, so a GPU or a torch build without per-row scaled FP8
    products is refused at load in one line rather than in the first step."""
    try:
        q, scale = quantize_rows(torch.randn(16, 32, device=device, dtype=torch.bfloat16))
        scaled_matmul(q, scale, q, scale, torch.bfloat16)
        torch.cuda.synchronize(device)
    except (RuntimeError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TrainerError(f"target_precision: fp8: torch._scaled_mm with per-row scales does not run on "
                           f"{torch.cuda.get_device_name(device)} with torch {torch.__version__} ({reason}); use "
                           f"target_precision: bf16") from None
