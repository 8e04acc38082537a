"""Sibling projections as one product (trainer/model/siblings.py): q, k and v (gate and up) of every layer run as
one product per input, their slices give the separate layers' outputs, an FP8 target multiplies once per group,
an input changed in place is multiplied anew, and splitting gives back layers equal to the originals."""
from __future__ import annotations

import torch
from torch import nn

from tests.trainer.tiny_models import random_ids, tiny_target_dir  # noqa: F401  (fixture)
from trainer.model import fp8, kernels, siblings
from trainer.model.target import TargetModel


def _load(path, *, fp8_emulated: bool = False) -> TargetModel:
    target = TargetModel.load(path, layer_ids=None, num_taps=3, dtype=torch.float32)
    if fp8_emulated:
        target.to_fp8(emulate=True)
    kernels.install_target(target.hf_model, "torch")
    return target


def _products(target) -> list[str]:
    """Each linear product the target runs, by module name, in order, for the features of one batch."""
    names, hooks = [], []
    for name, module in target.decoder.layers.named_modules(remove_duplicate=False):
        if type(module) in (nn.Linear, fp8.Fp8Linear) and ".product." not in f".{name}":
            hooks.append(module.register_forward_hook(lambda *_, name=name: names.append(name)))
    try:
        target.features(random_ids(target, (2, 30), seed=4))
    finally:
        for hook in hooks:
            hook.remove()
    return names


def test_each_group_is_one_product_and_gives_the_separate_layers_features(tiny_target_dir):
    target = _load(tiny_target_dir)
    input_ids = random_ids(target, (3, 37), seed=1)
    separate = target.features(input_ids, final=True)
    layers = target.num_layers
    assert siblings.merge_siblings(target.decoder.layers) == 2 * layers
    attention = target.decoder.layers[0].self_attn
    assert isinstance(attention.k_proj, siblings.SiblingPart) and attention.q_proj.product is attention.v_proj.product
    assert attention.q_proj.product.widths == (attention.q_proj.product.linear.out_features - 2 *
                                               attention.k_proj.product.widths[1],) + attention.q_proj.product.widths[1:]
    merged = target.features(input_ids, final=True)
    for got, want in zip(merged, separate):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # per layer run (the features stop at the last tap): the attention's one product, o, the MLP's one, down
    run, calls = target.layer_ids[-1] + 1, []
    for layer in target.decoder.layers:
        for part in (layer.self_attn.q_proj, layer.mlp.gate_proj):
            part.product.linear.register_forward_hook(lambda *_: calls.append(1))
    assert len(_products(target)) == 2 * run and len(calls) == 2 * run
    assert all(layer.self_attn.q_proj.product.pending is None for layer in target.decoder.layers)   # nothing held

    assert siblings.split_siblings(target.decoder.layers) == 2 * layers
    assert type(attention.q_proj) is nn.Linear and not siblings.split_siblings(target.decoder.layers)
    assert len(_products(target)) == 7 * run
    for got, want in zip(target.features(input_ids, final=True), separate):
        torch.testing.assert_close(got, want, rtol=0, atol=0)   # the same weights, each its own product again


def test_an_fp8_target_multiplies_once_per_group_with_the_same_scales(tiny_target_dir):
    """Stacking E4M3 weights keeps each output channel's own scale: the merged products are the separate ones'."""
    target = _load(tiny_target_dir, fp8_emulated=True)
    input_ids = random_ids(target, (2, 41), seed=2)
    separate = target.features(input_ids)
    products = []
    for module in target.decoder.layers.modules():
        if isinstance(module, fp8.Fp8Linear):
            module.matmul = lambda *a, **k: products.append(1) or fp8.emulated_matmul(*a, **k)
    siblings.merge_siblings(target.decoder.layers)
    stacked = target.decoder.layers[0].mlp.gate_proj.product.linear
    assert isinstance(stacked, fp8.Fp8Linear) and stacked.weight.dtype == torch.float8_e4m3fn
    assert stacked.weight_scale.shape == (stacked.out_features,)
    products.clear()
    torch.testing.assert_close(target.features(input_ids), separate, rtol=1e-5, atol=1e-5)
    assert len(products) == 4 * (target.layer_ids[-1] + 1)


def test_a_part_called_with_another_input_or_one_changed_in_place_multiplies_anew():
    torch.manual_seed(0)
    q, k = nn.Linear(8, 6, bias=True), nn.Linear(8, 2, bias=True)
    product = siblings.MergedProduct(siblings.stack([q, k]), (6, 2))
    calls = []
    product.linear.register_forward_hook(lambda *_: calls.append(1))
    first, second = siblings.SiblingPart(product, 0), siblings.SiblingPart(product, 1)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(first(x), q(x))
        x.mul_(2.0)                                  # in place after the first part: the second must see it
        torch.testing.assert_close(second(x), k(x))
        assert len(calls) == 2
        torch.testing.assert_close(first(x), q(x))            # from the second's product: both parts served
        assert len(calls) == 2 and product.pending is None
        torch.testing.assert_close(second(x.clone()), k(x))   # another tensor: its own product
        torch.testing.assert_close(first(x), q(x))            # and x is not that tensor
        torch.testing.assert_close(first(x), q(x))            # the same part twice: a new product
        assert len(calls) == 5
    mixed = nn.Module()
    mixed.q_proj, mixed.k_proj, mixed.v_proj = q, nn.Linear(4, 2), nn.Linear(8, 2)
    assert siblings.merge_siblings(mixed) == 0 and mixed.q_proj is q   # input sizes differ: left as they are
