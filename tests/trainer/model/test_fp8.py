"""The FP8 target pass (trainer/model/fp8.py, `target_precision: fp8`): the quantization's scales and round trip,
the product against a float reference (emulated on the CPU; the real _scaled_mm in the `gpu` tests), a tiny
target's features through it, and its refusal on the CPU and on a GPU without FP8."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.conftest import write_config
from tests.trainer.tiny_models import make_drafter, random_ids, tiny_target_dir  # noqa: F401
from trainer.model import fp8
from trainer.planning.precision import fp8_refusal


HAS_FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
on_an_fp8_gpu = pytest.mark.skipif(not HAS_FP8, reason="needs a GPU with FP8 (compute capability 8.9 or above)")


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.detach().float() - reference.detach().float()).norm() / reference.detach().float().norm())


def test_each_row_is_scaled_to_e4m3s_range_and_comes_back_to_within_its_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g)
    x[1] *= 1e-4                     # a row of small activations beside large ones: each keeps its own scale
    x[2] *= 1e4
    x[3] = 0.0                       # a row of zeros: zeros back, no NaN
    q, scale = fp8.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (4,)
    torch.testing.assert_close(scale[:3], x[:3].abs().amax(-1) / 448.0)
    # the row's largest magnitude lands on E4M3's largest value exactly
    assert torch.equal(q[:3].float().abs().amax(-1), torch.full((3,), 448.0))
    back = fp8.dequantize(q, scale)
    assert torch.equal(back[3], torch.zeros(64)) and torch.isfinite(back).all()
    # E4M3 keeps 3 mantissa bits: each normal value within 2^-4 of itself, the smallest ones within the
    # subnormal step 2^-9 of the row's scale
    bound = 2.0 ** -4 * x[:3].abs() + 2.0 ** -9 * scale[:3, None]
    assert ((back[:3] - x[:3]).abs() <= bound).all()
    for row in range(3):
        assert relative_error(back[row], x[row]) < 0.04


def test_a_linear_layer_in_fp8_against_the_float_product():
    """Fp8Linear with the emulated product (what _scaled_mm computes: the same quantized operands and scales)
    against the float layer: within E4M3's rounding; and a global scale instead of per-token ones would lose a
    row of small activations, which per-token scales keep."""
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(128, 48, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 128, generator=g) * torch.logspace(-2, 1, 48)[:, None])
    x = torch.randn(3, 5, 128, generator=g)
    x[1] *= 1e-3
    reference = linear(x)
    layer = fp8.Fp8Linear.of(linear, matmul=fp8.emulated_matmul)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (48,)
    out = layer(x)
    assert out.shape == reference.shape and out.dtype == x.dtype
    assert relative_error(out, reference) < 0.06
    assert relative_error(out[1], reference[1]) < 0.06          # the small tokens as well as the large
    # the weight's channels span three decades: per-channel scales keep the small ones
    assert relative_error(out[..., :8], reference[..., :8]) < 0.06
    assert layer(torch.empty(0, 128)).shape == (0, 48)


def test_a_tiny_targets_features_through_fp8_linear_layers(tiny_target_dir):
    from trainer.model.target import TargetModel

    reference = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, dtype=torch.float32)
    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, dtype=torch.float32)
    target.to_fp8(emulate=True)
    swapped = [m for m in target.hf_model.modules() if isinstance(m, fp8.Fp8Linear)]
    assert len(swapped) == 7 * target.spec.num_layers            # q, k, v, o, gate, up, down of every layer
    assert isinstance(target.lm_head, torch.nn.Linear) and target.lm_head.weight.dtype == torch.float32
    assert "fp8 linear layers" in target.describe()
    input_ids = random_ids(reference, (2, 40), seed=3)
    error = relative_error(target.features(input_ids), reference.features(input_ids))
    # each product is off by about 3.5 % (2.5 % from each operand's rounding, measured); this random-weight
    # target amplifies that to 13-16 % at its taps (it did so through its q/k norms and softmax)
    assert 0 < error < 0.25, error


def test_fp8_is_refused_on_the_cpu_and_on_a_gpu_without_fp8():
    assert "this run would be on the CPU" in fp8_refusal(None)
    assert "NVIDIA A100-SXM4-80GB has 8.0" in fp8_refusal(("NVIDIA A100-SXM4-80GB", (8, 0)))
    assert fp8_refusal(("NVIDIA L4", (8, 9))) is None and fp8_refusal(("NVIDIA H100 80GB HBM3", (9, 0))) is None


def test_check_refuses_fp8_on_the_cpu_in_one_line_with_exit_2(base_config, tmp_path, capsys):
    from trainer.__main__ import main

    path = write_config(tmp_path / "fp8.yaml", **{**base_config, "target_precision": "fp8"})
    assert main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("target_precision: fp8 needs a GPU with FP8" in line for line in lines) and "Traceback" not in err
    assert len([line for line in lines if "target_precision" in line]) == 1, err
    assert main(["check", "--config", str(write_config(tmp_path / "bf16.yaml", **base_config))]) == 0


@pytest.mark.gpu
@on_an_fp8_gpu
@pytest.mark.parametrize("rows", [333, 4096])
def test_scaled_mm_gives_the_emulated_product_and_bf16s_within_fp8s_rounding(rows):
    g = torch.Generator(device="cuda").manual_seed(2)
    linear = torch.nn.Linear(1024, 2048, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(2048, 1024, device="cuda", generator=g) * 0.02)
    x = torch.randn(rows, 1024, device="cuda", generator=g).to(torch.bfloat16)
    x[: rows // 3] *= 30                      # tokens of very different sizes in one batch
    real = fp8.Fp8Linear.of(linear)              # torch._scaled_mm, the quantizer compiled as the trainer runs it
    emulated = fp8.Fp8Linear.of(linear, matmul=fp8.emulated_matmul)
    with torch.no_grad():
        out, emulated_out, reference = real(x), emulated(x), linear(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 2048)
    assert relative_error(out, emulated_out) < 1e-2      # the same operands and scales; bf16 rounding apart
    assert relative_error(out, reference) < 0.06
    print(f"\nfp8 against bf16, {rows} x 1024 x 2048: relative error {relative_error(out, reference):.4f}")


@pytest.mark.gpu
@on_an_fp8_gpu
def test_an_fp8_targets_features_on_the_gpu_against_bf16(tiny_target_dir):
    from trainer.model.target import TargetModel

    load = dict(layer_ids=None, num_taps=3, device="cuda", dtype=torch.bfloat16)
    reference = TargetModel.load(tiny_target_dir, **load)
    target = TargetModel.load(tiny_target_dir, **load, precision="fp8")
    assert "fp8 linear layers (42)" in target.describe()
    for shape in ((2, 40), (3, 57)):          # token counts change from batch to batch
        input_ids = random_ids(reference, shape, seed=sum(shape))
        with torch.no_grad():
            error = relative_error(target.features(input_ids), reference.features(input_ids))
        assert 0 < error < 0.3, error


def test_activations_shared_by_projections_are_quantized_once_and_a_changed_input_again(tiny_target_dir):
    """q, k and v read one input, gate and up another: four quantizations a layer, not seven, and the features
    are those of quantizing every time. An input changed in place, or another tensor, is quantized anew."""
    from trainer.model.target import TargetModel

    calls = []

    def counted(rows):
        calls.append(rows.shape)
        return fp8.quantize_rows(rows)

    once = fp8.QuantizeOnce(counted)
    x = torch.randn(5, 32)
    first = once(x, x)
    assert once(x, x) is first and len(calls) == 1
    x.add_(1.0)
    assert once(x, x) is not first and len(calls) == 2
    assert once(x.clone(), x) is not None and len(calls) == 3

    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, dtype=torch.float32)
    target.to_fp8(emulate=True)
    input_ids = random_ids(target, (2, 40), seed=3)
    layers = [m for m in target.hf_model.modules() if isinstance(m, fp8.Fp8Linear)]
    shared = layers[0].quantize
    assert all(layer.quantize is shared for layer in layers)
    shared.quantize, calls[:] = counted, []
    features = target.features(input_ids, final=True)[0]
    assert len(calls) == 4 * target.spec.num_layers
    for layer in layers:   # every projection quantizing its own input, as before
        layer.quantize = fp8.QuantizeOnce(fp8.quantize_rows)
    torch.testing.assert_close(target.features(input_ids, final=True)[0], features, rtol=0, atol=0)
