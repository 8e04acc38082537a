"""Sibling projections of the frozen target as one product: an attention's q, k and v (and an MLP's gate and up)
read the same input, so their weights stacked make one matrix product where there were three (two), and an FP8
target quantizes that input once for it. Each projection's module becomes a SiblingPart, which hands on its
slice of the one product: the first part called with an input computes the whole product, the others, called
with the same input, take theirs from it.

The slices are strided views of the product. The target's own torch modules and a compiled layer read them as
they are (Inductor fuses the strided reads into the norm or SwiGLU after them); liger's kernels assume rows of
their own width, so TargetModel.compile_layers merges only around the target's torch modules, and splits the
projections back (split_siblings) before liger's kernels are bound again.
"""
from __future__ import annotations

import torch
from torch import nn

from trainer.model import fp8

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class MergedProduct(nn.Module):
    """The projections' weights stacked in one linear layer (an nn.Linear or an Fp8Linear); `widths` are the
    projections' output sizes in order."""

    def __init__(self, linear: nn.Module, widths: tuple[int, ...]):
        super().__init__()
        self.linear, self.widths = linear, tuple(widths)
        self.pending = None   # (input, its version, the product's slices, the parts already given theirs)

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()   # in a graph nothing changes x in place between two parts
        version = None if compiling else x._version
        pending = self.pending
        if pending is None or pending[0] is not x or pending[1] != version or index in pending[3]:
            pending = (x, version, self.linear(x).split(self.widths, dim=-1), ())
        served = pending[3] + (index,)
        # once every part has its slice nothing is held: a compiled layer's graph keeps no product alive
        self.pending = None if len(served) == len(self.widths) else (*pending[:3], served)
        return pending[2][index]


class SiblingPart(nn.Module):
    """One projection's place in its module: its slice of the merged product."""

    def __init__(self, product: MergedProduct, index: int):
        super().__init__()
        self.product, self.index = product, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product.part(x, self.index)

    def extra_repr(self) -> str:
        return f"part {self.index} of {self.product.widths}"


def _kind(module: nn.Module):
    return type(module) if type(module) in (nn.Linear, fp8.Fp8Linear) else None


def stack(modules: list[nn.Module]) -> nn.Module:
    """nn.Linear (or Fp8Linear) layers of one input size as one, their output channels in order."""
    first = modules[0]
    bias = None if first.bias is None else torch.cat([m.bias for m in modules])
    weight = torch.cat([m.weight for m in modules])
    if isinstance(first, fp8.Fp8Linear):
        return fp8.Fp8Linear(weight, torch.cat([m.weight_scale for m in modules]), bias, first.out_dtype,
                             quantize=first.quantize, matmul=first.matmul)
    return _linear(weight, bias)


def cut(module: nn.Module, start: int, stop: int) -> nn.Module:
    """Output channels start..stop of a stacked layer, as a layer of its own kind (views of its tensors)."""
    bias = None if module.bias is None else module.bias[start:stop]
    if isinstance(module, fp8.Fp8Linear):
        return fp8.Fp8Linear(module.weight[start:stop], module.weight_scale[start:stop], bias, module.out_dtype,
                             quantize=module.quantize, matmul=module.matmul)
    return _linear(module.weight[start:stop], bias)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
    return linear


def _mergeable(children: list[nn.Module | None]) -> bool:
    kinds = {_kind(child) for child in children}
    if len(kinds) != 1 or None in kinds:
        return False
    return len({(c.in_features, c.weight.dtype, c.bias is None) for c in children}) == 1


def merge_siblings(layers: nn.Module) -> int:
    """Every group of sibling projections under `layers` (the target's decoder layers) as one product, in place;
    how many groups were merged. A group whose projections differ in kind, input size, dtype or bias stays."""
    merged = 0
    for parent in list(layers.modules()):
        for names in SIBLINGS:
            children = [getattr(parent, name, None) for name in names]
            if not _mergeable(children):
                continue
            product = MergedProduct(stack(children), tuple(c.out_features for c in children))
            for index, name in enumerate(names):
                setattr(parent, name, SiblingPart(product, index))
            merged += 1
    return merged


def split_siblings(layers: nn.Module) -> int:
    """merge_siblings undone: each projection its own layer again (its slice of the stacked weights); how many
    groups were split."""
    split = 0
    for parent in list(layers.modules()):
        for names in SIBLINGS:
            parts = [getattr(parent, name, None) for name in names]
            if not all(isinstance(part, SiblingPart) for part in parts):
                continue
            product, start = parts[0].product, 0
            for name, width in zip(names, product.widths):
                setattr(parent, name, cut(product.linear, start, start + width))
                start += width
            split += 1
    return split
