"""The drafter's kernels: liger-kernel's fused RMSNorm and SwiGLU where they run, the torch code elsewhere, and
the dtype the drafter's elementwise code hands on (no fp32 residual stream, no cast of the features to fp32)."""
from __future__ import annotations

import types

import pytest
import torch

from tests.trainer.tiny_models import device, make_drafter, random_ids, tiny_target, tiny_target_dir  # noqa: F401
from trainer.errors import TrainerError
from trainer.model import kernels
from trainer.model.drafter import RMSNorm


def test_auto_takes_torch_where_liger_cannot_run():
    assert kernels.resolve("auto", torch.device("cpu")) == "torch"
    assert kernels.resolve("torch", torch.device("cuda")) == "torch"
    with pytest.raises(TrainerError, match="kernels: liger was asked for"):
        kernels.resolve("liger", torch.device("cpu"))


def test_rms_norm_keeps_a_bf16_input_bf16_under_an_fp32_weight():
    norm = RMSNorm(32, 1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 32)
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    # the same numbers as the fp32 computation, rounded once
    torch.testing.assert_close(out.float(), norm(x), rtol=1e-2, atol=1e-2)


def test_under_autocast_the_features_reach_fc_as_they_are(tiny_target):
    drafter = make_drafter(tiny_target)
    seen = []
    hook = drafter.fc.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    features = torch.randn(2, 12, drafter.fc.in_features, device=tiny_target.device).bfloat16()
    try:
        with torch.autocast(tiny_target.device.type, dtype=torch.bfloat16):
            context = drafter.project_context(features)
        drafter.project_context(features.float())
    finally:
        hook.remove()
    assert seen == [torch.bfloat16, torch.float32] and context.dtype == torch.bfloat16


def test_installing_torch_restores_the_modules_own_forward(tiny_target):
    drafter = make_drafter(tiny_target)
    norm = drafter.layers[0].input_layernorm
    norm.forward = types.MethodType(kernels._liger_rms_norm, norm)   # what a swapped kernel looks like to it
    other = drafter.layers[0].post_attention_layernorm
    other.forward = theirs = lambda x: x * 0   # bound by someone else (a hook library): not install's to take back
    assert kernels.install(drafter, "torch") == "drafter RMSNorm and SwiGLU: torch"
    x = torch.randn(3, tiny_target.hidden_size, device=tiny_target.device)
    torch.testing.assert_close(norm(x), RMSNorm.forward(norm, x))
    assert other.forward is theirs


def _drafter_pass(drafter, target, *, grad: bool = True):
    from trainer.training.objective import dflash_step

    input_ids = random_ids(target, (2, 40), seed=5)
    with torch.set_grad_enabled(grad):
        out = dflash_step(drafter, target.features(input_ids), input_ids, torch.ones_like(input_ids), num_anchors=4,
                          block_size=8, gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(0))
    if grad:
        out.loss.backward()
    return out.loss.detach(), [p.grad for p in drafter.parameters() if p.grad is not None]


def test_the_drafter_rope_compiled_gives_the_eager_loss_and_gradients(tiny_target):
    """bind_drafter_rope: the drafter's attention layers call the compiled rotary embedding while training (the
    CPU standing in for the GPU here), the same loss and gradients as the torch code, and the torch code again
    once unbound."""
    from trainer.model import modeling_dflash

    own = modeling_dflash.apply_rope
    eager = _drafter_pass(make_drafter(tiny_target, seed=2), tiny_target)
    calls = []

    def compile_fn(fn):
        compiled = torch.compile(fn, dynamic=True)
        return lambda *args: calls.append(args[0].shape) or compiled(*args)

    try:
        kernels.bind_drafter_rope(True, devices=(tiny_target.device.type,), compile_fn=compile_fn)
        compiled = _drafter_pass(make_drafter(tiny_target, seed=2), tiny_target)
        trained_calls = len(calls)
        _drafter_pass(make_drafter(tiny_target, seed=2), tiny_target, grad=False)   # evaluation: eager
        assert len(calls) == trained_calls
    finally:
        assert kernels.bind_drafter_rope(False) is False
    assert modeling_dflash.apply_rope is own
    # q and k of every layer, each through the compiled function
    assert trained_calls == 2 * make_drafter(tiny_target).config.num_hidden_layers
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_drafter_rope_is_compiled_only_with_liger_s_kernels(tiny_target):
    from trainer.model import modeling_dflash

    own, drafter = modeling_dflash.apply_rope, make_drafter(tiny_target)
    try:
        assert kernels.install_drafter(drafter, "liger").endswith("; drafter RoPE: torch.compile")
        assert modeling_dflash.apply_rope._dflash_own is own
        assert kernels.install_drafter(drafter, "torch") == "drafter RMSNorm and SwiGLU: torch"
        assert modeling_dflash.apply_rope is own
    finally:
        kernels.bind_drafter_rope(False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or kernels.liger_version() is None,
                    reason="needs a CUDA GPU and liger-kernel")
def test_liger_kernels_match_the_torch_code_in_bf16(tiny_target_dir):
    from trainer.model.target import TargetModel
    from trainer.training.objective import dflash_step

    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cuda", dtype=torch.bfloat16)
    input_ids = random_ids(target, (2, 96), seed=3)
    loss_mask = torch.ones_like(input_ids)
    results = []
    try:
        for choice in ("torch", "liger"):   # liger's: its RMSNorm and SwiGLU, and the drafter's RoPE compiled
            drafter = make_drafter(target, seed=1).float().train()
            kernels.install_drafter(drafter, choice)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                features = target.features(input_ids)
                out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=8, block_size=8, gamma=4.0,
                                  noise=0.0, generator=torch.Generator().manual_seed(0))
            out.loss.backward()
            results.append((out.loss.detach().float(), [p.grad.float() for p in drafter.parameters()]))
    finally:
        kernels.bind_drafter_rope(False)
    (loss_t, grads_t), (loss_l, grads_l) = results
    torch.testing.assert_close(loss_l, loss_t, rtol=1e-2, atol=1e-2)
    for g_l, g_t in zip(grads_l, grads_t):
        assert float((g_l - g_t).norm() / g_t.norm().clamp(min=1e-12)) < 5e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or kernels.liger_version() is None,
                    reason="needs a CUDA GPU and liger-kernel")
@pytest.mark.parametrize("family, dtype, bound", [("qwen3", torch.bfloat16, 2e-2), ("qwen3.5", torch.float32, 1e-3),
                                                  ("qwen3.5-moe", torch.float32, 1e-3)])
def test_target_kernels_give_the_target_s_own_features(tmp_path, family, dtype, bound):
    """liger's RMSNorm (llama rounding for Qwen3, 1 + weight and fp32 throughout for Qwen3.5) and SwiGLU, and fla's
    gated RMSNorm, in the frozen target: its tapped features agree with its own torch modules', and "torch" puts
    those back exactly. Hybrids compare in fp32: in bf16 the fused kernels round once where transformers rounds
    between steps, and a random tiny model amplifies that (its MoE router flips experts: 3 % and 15 % relative
    on an H200, against 1e-4 in fp32)."""
    from trainer.model.target import TargetModel
    from trainer.model.tiny_target import write_tiny_target

    path = write_tiny_target(tmp_path / "t", seed=2, family=family)
    target = TargetModel.load(path, layer_ids=None, num_taps=3, device="cuda", dtype=dtype)
    input_ids = random_ids(target, (3, 160), seed=4)
    mask = torch.ones_like(input_ids)
    mask[1, 100:] = 0
    mask = mask.cpu()
    own = target.features(input_ids, mask)
    line = kernels.install_target(target.hf_model, "liger")
    assert line.startswith("target RMSNorm, SwiGLU and RoPE: liger-kernel")
    swapped = [m for m in target.hf_model.modules() if "forward" in m.__dict__]
    assert len(swapped) >= 2 * target.num_layers   # two norms and an MLP (or a shared expert) per layer at least
    fused = target.features(input_ids, mask)
    assert kernels.install_target(target.hf_model, "torch") == "target RMSNorm and SwiGLU: torch"
    torch.testing.assert_close(target.features(input_ids, mask), own, rtol=0, atol=0)
    real = mask.bool().cuda()
    got, expected = fused[real].float(), own[real].float()
    assert float((got - expected).norm() / expected.norm()) < bound


@pytest.mark.parametrize("family, norm, mlp", [("qwen3", "Qwen3RMSNorm", "Qwen3MLP"),
                                               ("qwen3.5", "Qwen3_5RMSNorm", "Qwen3_5MLP")])
def test_target_kernels_swap_every_norm_and_swiglu_and_nothing_else(tmp_path, family, norm, mlp):
    """Which of the target's modules liger stands in for (the swap itself; its numbers are the GPU test's)."""
    from trainer.model.target import TargetModel
    from trainer.model.tiny_target import write_tiny_target

    target = TargetModel.load(write_tiny_target(tmp_path / "t", family=family), layer_ids=None, num_taps=2)
    kernels.install_target(target.hf_model, "liger")
    swapped = {type(m).__name__ for m in target.hf_model.modules() if "forward" in m.__dict__}
    unswapped = {type(m).__name__ for m in target.hf_model.modules()
                 if "forward" not in m.__dict__ and type(m).__name__ in (norm, mlp)}
    assert swapped == {norm, mlp} and not unswapped
    target.hf_model.config.hidden_act = "gelu"   # not a SwiGLU: the MLPs keep their own forward
    kernels.install_target(target.hf_model, "torch")
    kernels.install_target(target.hf_model, "liger")
    assert {type(m).__name__ for m in target.hf_model.modules() if "forward" in m.__dict__} == {norm}


def test_block_convolution_compiles_only_the_declared_bucket_shapes_and_runs_the_rest_eager():
    """kernels.StaticShapeConv: the trainer's bucket shapes go to the compiled convolution (a stand-in for
    torch.compile here), any other shape and every call without autograd run the eager code; both give the
    module's own output and gradients, and the shapes come one per bucket from the layout's batch sizes."""
    from trainer.model.modeling_dflash import BlockConv, side_conv
    from trainer.training.compile_warmup import conv_shapes

    torch.manual_seed(0)
    conv = BlockConv(32, kernel_size=2, group_size=16, block_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    compiled_calls = []

    def fake_compile(fn):
        assert fn is side_conv
        def run(*args, **kwargs):
            compiled_calls.append(tuple(args[0].shape[:2]))
            return fn(*args, **kwargs)
        return run

    shapes = conv_shapes([2, 3, 3], lambda batch: 12 // batch, 4)
    assert shapes == [(2, 24), (3, 16)]   # one per bucket batch size: 6 and 4 anchors of 4 slots
    static = kernels.StaticShapeConv(shapes, compile_fn=fake_compile)
    for batch, tokens, grad, compiled in [(2, 24, True, True), (3, 16, True, True), (1, 8, True, False),
                                          (2, 24, False, False)]:
        y = torch.randn(batch, tokens, 32, requires_grad=grad)
        normed = torch.randn(batch, tokens, 32)
        expected_calls = len(compiled_calls) + compiled
        for side in (0, 1):
            with torch.set_grad_enabled(grad):
                reference = conv(y, conv.kernels(normed), side)
                out = static.forward(conv, y, conv.kernels(normed), side)
            torch.testing.assert_close(out, reference)
            if grad:
                (g_ref,) = torch.autograd.grad(reference.square().sum(), y)
                (g_out,) = torch.autograd.grad(out.square().sum(), y)
                torch.testing.assert_close(g_out, g_ref)
        assert len(compiled_calls) == expected_calls + compiled   # both sides, or neither
    assert set(compiled_calls) == set(shapes)
    # off a GPU nothing is bound: the modules run their own code
    assert kernels.compile_block_convs(conv, torch.device("cpu"), shapes=shapes) is None
    assert "forward" not in conv.__dict__


def test_the_targets_rope_binding_wraps_its_familys_function_once_and_torch_puts_it_back(tiny_target):
    """bind_rope wraps the modeling module's apply_rotary_pos_emb (CUDA tensors take liger's kernel; these CPU
    ones the function itself, so the features are unchanged), never wraps it twice, and "torch" restores the
    very function transformers defined."""
    import sys

    family = sys.modules[type(tiny_target.hf_model).__module__]
    own = family.apply_rotary_pos_emb
    input_ids = random_ids(tiny_target, (2, 40), seed=1)
    before = tiny_target.features(input_ids)
    try:
        assert kernels.bind_rope(tiny_target.hf_model, True) and kernels.bind_rope(tiny_target.hf_model, True)
        assert family.apply_rotary_pos_emb is not own and family.apply_rotary_pos_emb._dflash_own is own
        torch.testing.assert_close(tiny_target.features(input_ids), before, rtol=0, atol=0)
    finally:
        assert not kernels.bind_rope(tiny_target.hf_model, False)
    assert family.apply_rotary_pos_emb is own
