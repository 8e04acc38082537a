"""The target's decoder layers through one torch.compile'd function (TargetModel.compile_layers): the same features
as the eager layers, padded and packed, bf16 products or FP8 ones, and no new graph for a new batch shape."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.tiny_models import device, tiny_target, tiny_target_dir  # noqa: F401  (fixtures)
from trainer.model.siblings import SiblingPart
from trainer.model.target import TargetModel, run_layer


def _batches(vocab_size: int, shapes, seed: int = 0):
    """Right-padded batches of the given (rows, columns), the first row of each full."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for rows, columns in shapes:
        ids = torch.randint(0, vocab_size, (rows, columns), generator=generator)
        lengths = torch.randint(columns // 2, columns + 1, (rows,), generator=generator)
        lengths[0] = columns
        batches.append((ids, (torch.arange(columns)[None] < lengths[:, None]).long()))
    return batches


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _real(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return features[mask.to(features.device).bool()]


@pytest.mark.parametrize("packing", [False, True])
def test_compiled_layers_give_the_eager_features_and_compile_once(tiny_target_dir, device, packing):
    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device=device, dtype=torch.float32,
                              packing=packing)
    batches = _batches(target.config.vocab_size, [(3, 40), (2, 64), (4, 33), (3, 50), (5, 21)])
    expected = [target.features(ids, mask) for ids, mask in batches]
    target.compile_layers()
    assert isinstance(target.decoder.layers[0].mlp.up_proj, SiblingPart)   # q, k, v (gate, up): one product each
    graphs, breaks = [_graphs()], _breaks()
    for (ids, mask), want in zip(batches, expected):
        got = target.features(ids, mask)
        torch.testing.assert_close(_real(got, mask), _real(want, mask), rtol=1e-4, atol=1e-4)
        graphs.append(_graphs())
    # the first batch compiles the layer's one graph (attention is one operator in it, packed or not) for any
    # token count; later shapes and packed batches' sequences (new every batch) reuse it
    assert graphs[1] == graphs[0] + 1 and graphs[-1] == graphs[1] and _breaks() == breaks
    target.compile_layers(False)
    assert target.run_layer is run_layer and isinstance(target.decoder.layers[0].mlp.up_proj, torch.nn.Linear)


def test_a_compiled_fp8_target_equals_its_eager_self(tiny_target_dir):
    """FP8 products (emulated: the CPU has no FP8 matrix cores) inside the compiled layers: the quantization the
    graph fuses gives what the eager layers' quantize-once gives."""
    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cpu", dtype=torch.float32)
    target.to_fp8(emulate=True)
    batches = _batches(target.config.vocab_size, [(2, 24), (3, 31)], seed=1)
    expected = [target.features(ids, mask) for ids, mask in batches]
    target.compile_layers()
    # the products' bf16 outputs (FP8's out_dtype) rounded as the eager layers round them: Inductor drops a cast
    # to bf16 and back by default, and a random tiny target amplifies that rounding layer after layer
    with torch._inductor.config.patch(emulate_precision_casts=True):
        for (ids, mask), want in zip(batches, expected):
            got = target.features(ids, mask)
            torch.testing.assert_close(_real(got, mask), _real(want, mask), rtol=1e-4, atol=1e-4)


def test_compile_target_auto_compiles_an_fp8_dense_target_only(tiny_target_dir):
    """compile_target: auto (the default) compiles where it was measured to pay: an FP8 target's layers, not a bf16
    target's (liger's kernels were as fast); a hybrid's never (next test: fla's kernels are not compiled with it)."""
    from trainer.config import TrainConfig

    assert TrainConfig.model_fields["compile_target"].default == "auto"
    dense = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cpu", dtype=torch.float32)
    assert [dense.compiles_layers(s) for s in ("auto", True, False)] == [False, True, False]
    dense.to_fp8(emulate=True)
    assert [dense.compiles_layers(s) for s in ("auto", True, False)] == [True, True, False]


def test_compile_target_auto_leaves_an_fp8_hybrid_eager(tmp_path):
    from trainer.model.tiny_target import write_tiny_target

    hybrid = TargetModel.load(write_tiny_target(tmp_path / "hybrid", family="qwen3.5"), layer_ids=None, num_taps=3,
                              device="cpu", dtype=torch.float32)
    hybrid.to_fp8(emulate=True)
    assert hybrid.precision.startswith("fp8") and not hybrid.compiles_layers("auto")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_compiled_bf16_and_fp8_layers_on_a_gpu_pack_through_varlen_flash(tiny_target_dir, precision):
    """The trainer's GPU path: bf16 (or FP8 products), batches packed through torch's varlen flash attention, one
    operator inside the graph; each batch's features as the eager layers give them, no graph for a new plan."""
    target = TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cuda", dtype=torch.bfloat16,
                              precision=precision)
    assert target.can_pack()
    batches = _batches(target.config.vocab_size, [(3, 40), (2, 64), (4, 33), (3, 50)], seed=2)
    expected = [target.features(ids, mask) for ids, mask in batches]
    target.compile_layers()
    graphs, breaks = [], _breaks()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        for (ids, mask), want in zip(batches, expected):
            got, want = _real(target.features(ids, mask), mask).float(), _real(want, mask).float()
            assert float((got - want).norm() / want.norm()) < 2e-2
            graphs.append(_graphs())
    assert graphs[-1] == graphs[1] and _breaks() == breaks, (graphs, _breaks() - breaks)
