"""The memory plan: target parameter counts against the models transformers builds, the ZeRO partition against
ZeroRedundancyOptimizer's, the activation estimate against what autograd really saves, and `train --plan`."""
from __future__ import annotations

import importlib.util

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env, write_config
from trainer.config import TrainConfig
from trainer.planning import drafter_bytes
from trainer.planning import memory_plan
from trainer.planning.target_families import read_target_spec, target_spec
from trainer.planning.target_size import target_params

# Qwen3.6-27B's text config (the seed run's target) and the public drafter recipe for it
QWEN36_27B = dict(model_type="qwen3_5_text", hidden_size=5120, num_hidden_layers=64, intermediate_size=17408,
                  num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                  linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_conv_kernel_dim=4, full_attention_interval=4, vocab_size=248320, tie_word_embeddings=False,
                  rms_norm_eps=1e-6, max_position_embeddings=262144)
TAPS_27B = [1, 16, 31, 46, 61]
SMALL = dict(hidden_size=64, num_hidden_layers=5, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=300, tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=512)
HYBRID = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_conv_kernel_dim=4, full_attention_interval=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)
TEXT_CONFIGS = {
    "qwen3_5_text 27B": QWEN36_27B,
    "qwen3_5_text": dict(SMALL, model_type="qwen3_5_text", **HYBRID),
    "qwen3_5_moe_text": dict(SMALL, model_type="qwen3_5_moe_text", shared_expert_intermediate_size=40, **HYBRID,
                             **MOE),
    "qwen3": dict(SMALL, model_type="qwen3"),
    "qwen3_moe": dict(SMALL, model_type="qwen3_moe", decoder_sparse_step=2, mlp_only_layers=[0], **MOE),
    "qwen2": dict(SMALL, model_type="qwen2"),
    "llama tied": dict(SMALL, model_type="llama", tie_word_embeddings=True, attention_bias=True),
}


def hf_params(text: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**text)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(TEXT_CONFIGS))
def test_target_params_equal_the_model_transformers_builds(name):
    text = TEXT_CONFIGS[name]
    assert target_params(text) == hf_params(text)


def run_config(target_path, **values) -> TrainConfig:
    return TrainConfig(target_path=str(target_path), data_path="data", output_dir="out", **values)


@pytest.mark.parametrize("family, composite", [("qwen3", False), ("qwen3.5", False), ("qwen3.5", True),
                                               ("qwen3.5-moe", True)])
def test_the_plan_counts_what_the_trainer_loads_and_builds(family, composite, tmp_path):
    """The target as TargetModel loads it (of a composite checkpoint, the language model only) and the drafter
    as train.py builds it, with a drafter_* key over the family's recipe."""
    import torch

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.target import TargetModel
    from trainer.model.tiny_target import write_tiny_target
    from trainer.planning.target_families import drafter_shape

    path = write_tiny_target(tmp_path / "target", family=family, composite=composite)
    target = TargetModel.load(path, layer_ids=None, num_taps=2)
    spec = read_target_spec(path)
    assert target_params(spec.text) == sum(p.numel() for p in target.hf_model.parameters())
    cfg = run_config(path, drafter_layers=2, block_size=8, drafter_intermediate_size=72)
    shape = drafter_shape(spec, intermediate_size=72)
    config = DrafterConfig.from_target(target.config, num_layers=2, block_size=8, target_layer_ids=target.layer_ids,
                                       mask_token_id=target.mask_token_id, shape=shape)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    sizes = memory_plan.DrafterSizes.for_run(spec, cfg, num_taps=2)
    assert sizes.param_numels() == [p.numel() for p in drafter.parameters()]
    assert memory_plan.DrafterSizes.from_drafter_config(config.to_hf_dict()) == sizes
    linear = sum(m.weight.numel() for m in drafter.modules() if isinstance(m, torch.nn.Linear))
    assert sizes.matmul_params() == linear


def test_the_plan_counts_a_dflash2_drafter_as_train_builds_it(tmp_path):
    """The convolutions and the selector in parameters() order, and in the linear layers autocast copies."""
    import torch

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.target import TargetModel
    from trainer.model.tiny_target import write_tiny_target
    from trainer.planning.dflash2 import Dflash2Sizes

    path = write_tiny_target(tmp_path / "target")
    target = TargetModel.load(path, layer_ids=None, num_taps=2)
    cfg = run_config(path, drafter_layers=2, architecture="dflash2", selector_rank=8, selector_top_k=4)
    sizes = memory_plan.DrafterSizes.for_run(read_target_spec(path), cfg, num_taps=2)
    config = DrafterConfig.from_target(target.config, num_layers=2, block_size=cfg.block_size,
                                       target_layer_ids=target.layer_ids, mask_token_id=target.mask_token_id,
                                       dflash2=Dflash2Sizes.from_mapping(cfg))
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    assert sizes.param_numels() == [p.numel() for p in drafter.parameters()]
    assert memory_plan.DrafterSizes.from_drafter_config(config.to_hf_dict()) == sizes
    linear = sum(m.weight.numel() for m in drafter.modules() if isinstance(m, torch.nn.Linear))
    assert sizes.matmul_params() == linear
    plain = memory_plan.DrafterSizes.for_run(read_target_spec(path), run_config(path, drafter_layers=2,
                                                                                block_size=8), num_taps=2)
    precision = memory_plan.Precision.of_run("bfloat16", on_gpu=True)
    more = [memory_plan.drafter_saved_bytes(d, precision, context_tokens=512, block_tokens=256) for d in (plain, sizes)]
    assert more[1] > more[0]   # the convolutions' and the selector's activations are in the plan


def test_the_27b_dflash2_drafter_adds_its_convolutions_and_selector():
    cfg = run_config("unused", architecture="dflash2")
    sizes = memory_plan.DrafterSizes.for_run(target_spec(QWEN36_27B), cfg, num_taps=5)
    dflash = memory_plan.DrafterSizes.for_run(target_spec(QWEN36_27B), run_config("unused", block_size=8),
                                              num_taps=5)
    extra = sum(sizes.param_numels()) - sum(dflash.param_numels())
    # 5 layers x 2 convolutions x (4 x 5120 base + 1280 x 5120 projection), and 2 x 248320 x 256 + 256 x 5120
    assert extra == 5 * 2 * (4 * 5120 + 1280 * 5120) + 2 * 248320 * 256 + 256 * 5120


def test_a_composite_checkpoint_counts_its_language_model_only():
    composite = {"model_type": "qwen3_5", "vision_config": {"hidden_size": 1152, "depth": 27},
                 "text_config": QWEN36_27B}
    assert target_params(target_spec(composite).text) == target_params(QWEN36_27B)
    assert round(target_params(QWEN36_27B) / 1e9, 2) == 26.90


def test_the_27b_drafter_is_the_public_recipe():
    sizes = memory_plan.DrafterSizes.for_run(target_spec(QWEN36_27B), run_config("unused", block_size=16), num_taps=5)
    assert (sizes.num_heads, sizes.num_kv_heads, sizes.head_dim, sizes.intermediate_size) == (32, 8, 128, 17408)
    assert round(sum(sizes.param_numels()) / 1e9, 2) == 1.73


@pytest.mark.parametrize("ways", [2, 3, 8])
def test_zero_partition_is_zero_redundancy_optimizers(ways):
    """The partition of the 27B drafter's parameters, against ZeroRedundancyOptimizer as rank 0 of `ways` (a
    fake process group: the partition is computed on each rank alone, no collective runs)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.testing._internal.distributed.fake_pg import FakeStore

    numels = memory_plan.DrafterSizes.for_run(target_spec(QWEN36_27B), run_config("unused", block_size=16),
                                              num_taps=5).param_numels()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ways)
    try:
        params = [torch.nn.Parameter(torch.empty(n, device="meta")) for n in numels]
        zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)
        index = {id(p): i for i, p in enumerate(params)}
        theirs = [sorted(index[id(p)] for g in groups for p in g["params"]) for groups in zero._partition_parameters()]
    finally:
        dist.destroy_process_group()
    assert memory_plan.zero_partition(numels, ways) == theirs


# ---------------------------------------------------------------------------------------------- activations

def liger_stand_ins():
    """Modules named as liger-kernel's, whose autograd Functions compute what liger-kernel 0.8.5's compute and
    save exactly what those save (its Triton kernels cannot run on a CPU): LigerRMSNormFunction keeps X (its
    input, as it is), W and RSTD (fp32, one per row); LigerSiLUMulFunction keeps a and b (the gate's and the up
    projection's outputs) and recomputes silu in backward. Both make their inputs contiguous first, as liger's
    `ensure_contiguous` does."""
    import types

    import torch

    def wide(tensor):   # liger computes in fp32 (a float64 input stays float64: gradcheck)
        return tensor.to(torch.promote_types(tensor.dtype, torch.float32))

    class RMSNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
            shape = X.shape
            X = X.contiguous().view(-1, shape[-1])
            rstd = torch.rsqrt(wide(X).pow(2).mean(-1) + eps)
            ctx.offset = offset
            ctx.save_for_backward(X, W, rstd)
            return ((wide(X) * rstd[:, None]).to(X.dtype) * (offset + W)).to(X.dtype).view(shape)

        @staticmethod
        def backward(ctx, grad):
            X, W, rstd = ctx.saved_tensors
            normed, grad_2d = wide(X) * rstd[:, None], wide(grad.reshape(X.shape))
            scaled = grad_2d * wide(ctx.offset + W)
            grad_x = rstd[:, None] * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
            return (grad_x.to(X.dtype).view(grad.shape), (grad_2d * normed).sum(0).to(W.dtype),
                    None, None, None, None, None)

    class SiLUMulFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, gate_multiplier=1.0, down_multiplier=1.0):
            a, b = a.contiguous(), b.contiguous()
            ctx.save_for_backward(a, b)
            return torch.nn.functional.silu(wide(a)).to(b.dtype) * b

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            gate, sigmoid = wide(a), torch.sigmoid(wide(a))
            grad_a = wide(grad) * wide(b) * sigmoid * (1 + gate * (1 - sigmoid))
            return grad_a.to(a.dtype), (wide(grad) * gate * sigmoid).to(b.dtype), None, None

    names = ("liger_kernel", "liger_kernel.ops", "liger_kernel.ops.rms_norm", "liger_kernel.ops.swiglu")
    modules = {name: types.ModuleType(name) for name in names}
    modules["liger_kernel.ops.rms_norm"].LigerRMSNormFunction = RMSNormFunction
    modules["liger_kernel.ops.swiglu"].LigerSiLUMulFunction = SiLUMulFunction
    return modules


def small_drafter(num_layers: int, low, *, intermediate: int = 200):
    """(a drafter of hidden 96 whose embedding and LM head are in `low`, its DrafterConfig)."""
    import torch
    from transformers import Qwen3Config

    from trainer.model.drafter import DFlashDrafter, DrafterConfig

    target = Qwen3Config(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=intermediate, rms_norm_eps=1e-6, vocab_size=500,
                         max_position_embeddings=4096, num_hidden_layers=12)
    config = DrafterConfig.from_target(target, num_layers=num_layers, block_size=8, target_layer_ids=[1, 4, 7],
                                       mask_token_id=499)
    torch.manual_seed(0)
    embed, head = torch.nn.Embedding(500, 96).to(low), torch.nn.Linear(96, 500, bias=False).to(low)
    return DFlashDrafter(config, embed_tokens=embed, lm_head=head), config


def saved_tensor_bytes(*, autocast: bool, num_layers: int, batch: int, seq_len: int, num_anchors: int,
                       kernels: str = "torch", monkeypatch=None):
    """(bytes autograd keeps for one real drafter step, the plan's estimate of them) with the drafter's torch
    code or, for kernels="liger", the stand-ins of liger's Functions bound by kernels.install as on a GPU.

    Counted once per storage; left out: parameters, the target's features (planned on their own) and the dense
    mask SDPA keeps on the CPU (flex_attention on a GPU keeps a block mask of a few KiB instead)."""
    import torch

    from trainer.model import kernels as kernel_lib
    from trainer.training.objective import dflash_step

    low = torch.bfloat16 if autocast else torch.float32
    drafter, config = small_drafter(num_layers, low)
    embed, head = drafter.embed_tokens, drafter.lm_head
    if kernels == "liger":
        for name, module in liger_stand_ins().items():
            monkeypatch.setitem(sys.modules, name, module)
        assert kernel_lib.install(drafter, "liger").startswith("drafter RMSNorm and SwiGLU: liger-kernel")
    input_ids = torch.randint(0, 499, (batch, seq_len))
    features = torch.randn(batch, seq_len, 3 * 96).to(low)
    left_out = {p.untyped_storage().data_ptr() for p in [*drafter.parameters(), embed.weight, head.weight, features]}
    blocks = batch * min(num_anchors, seq_len - 1) * 8
    mask_shape = (batch, 1, blocks // batch, seq_len + blocks // batch)
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in left_out and tuple(tensor.shape) != mask_shape:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = dflash_step(drafter, features, input_ids, torch.ones_like(input_ids), num_anchors=num_anchors,
                              block_size=8, gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(0))
    out.loss.backward()   # the graph that was measured is a real training step's
    sizes = memory_plan.DrafterSizes.from_drafter_config(config.to_hf_dict())
    precision = memory_plan.Precision(target=2, act=2, casts=True) if autocast else memory_plan.Precision(4, 4, False)
    estimate = memory_plan.drafter_saved_bytes(sizes, precision, context_tokens=batch * seq_len, block_tokens=blocks,
                                               kernels=kernels)
    if autocast:  # autocast's bf16 copies of the weights, planned as their own line; fc's copy is made too
        # (autocast caches it until the forward ends) but not saved: its input, the features, needs no gradient
        estimate += 2 * (sizes.matmul_params() - sizes.num_taps * sizes.hidden_size ** 2)
    return sum(saved.values()), estimate


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "fp32"])
@pytest.mark.parametrize("shape", [(1, 2, 160, 12), (3, 3, 96, 20)], ids=["1-layer", "3-layers"])
def test_activation_estimate_is_within_1_percent_of_the_saved_tensors(autocast, shape):
    num_layers, batch, seq_len, anchors = shape
    measured, estimate = saved_tensor_bytes(autocast=autocast, num_layers=num_layers, batch=batch, seq_len=seq_len,
                                            num_anchors=anchors)
    assert measured > 0
    assert estimate == pytest.approx(measured, rel=0.01), (estimate, measured)


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "fp32"])
@pytest.mark.parametrize("shape", [(1, 2, 160, 12), (3, 3, 96, 20)], ids=["1-layer", "3-layers"])
def test_liger_activation_estimate_is_within_1_percent_of_what_liger_s_functions_save(autocast, shape, monkeypatch):
    """liger's Functions keep less than the torch code (no fp32 copy in any RMSNorm, no silu(gate)): the plan of
    a liger run counts what they keep, and the torch path's count would miss it by far more than 1 %."""
    num_layers, batch, seq_len, anchors = shape
    measured, estimate = saved_tensor_bytes(autocast=autocast, num_layers=num_layers, batch=batch, seq_len=seq_len,
                                            num_anchors=anchors, kernels="liger", monkeypatch=monkeypatch)
    torch_measured, torch_estimate = saved_tensor_bytes(autocast=autocast, num_layers=num_layers, batch=batch,
                                                        seq_len=seq_len, num_anchors=anchors)
    assert estimate == pytest.approx(measured, rel=0.01), (estimate, measured)
    assert measured < 0.8 * torch_measured and torch_estimate > 1.2 * measured


# ---------------------------------------------------------------------------------------------- the plan

def plan_config(tmp_path: Path, **values) -> Path:
    """A training config whose target is only the 27B's config.json: nothing there could be loaded."""
    target = tmp_path / "qwen3.6-27b"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": QWEN36_27B}))
    config = {"target_path": str(target), "data_path": str(tmp_path / "data"), "output_dir": str(tmp_path / "out"),
              "token_budget": 24576, "target_layer_ids": TAPS_27B, **values}
    return write_config(tmp_path / "plan.yaml", **config)


def run_plan(config: Path, *args: str) -> subprocess.CompletedProcess:
    """`train --plan` in a fresh interpreter, which also reports whether torch was imported."""
    code = ("import sys; from trainer.__main__ import main; rc = main(sys.argv[1:]); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "train", "--config", str(config), "--plan", *args],
                          capture_output=True, text=True, timeout=120, env=trainer_env(), cwd=REPO_ROOT)


def planned_total(stdout: str) -> float:
    first = stdout.splitlines()[0]
    return float(first.split("): ")[1].split(" GiB")[0])


def test_the_27b_plan_on_8_gpus_at_24k_tokens_fits_139_gib(tmp_path):
    result = run_plan(plan_config(tmp_path), "--gpus", "8", "--gpu-memory", "139")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Memory plan per GPU (one of 8 ranks): ") and "fits 139.0 GiB" in lines[0]
    assert planned_total(result.stdout) <= 139
    assert "26.90B params" in lines[1] and "1.73B params" in lines[2]
    assert "sharded 8 ways (0.22B params on the largest rank)" in lines[3]
    auto = "liger" if importlib.util.find_spec("liger_kernel") else "torch"  # auto takes liger where installed
    assert f"24576 tokens, 24576 block tokens, {auto} kernels" in lines[4]
    assert lines[-1] == "no torch"   # nothing loaded, not even torch


def test_the_plan_of_a_cpu_run_is_its_process_s_without_a_cuda_allowance(tmp_path):
    """`device: cpu` (the small configs of the README and the demo): no GPU, no CUDA context, and a tiny
    model's parameters counted in millions, not as `0.00B`."""
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False}))
    config = write_config(tmp_path / "cpu.yaml", target_path=str(target), data_path=str(tmp_path / "data"),
                          output_dir=str(tmp_path / "out"), device="cpu", drafter_layers=1, block_size=8,
                          token_budget=2048, buckets=[0, 128, 256, 512])
    result = run_plan(config, "--gpu-memory", "0.001")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Memory plan of the CPU process (one rank): ") and "limit not checked" in lines[0]
    assert "CUDA" not in result.stdout and "0.00B" not in result.stdout
    assert "M params" in lines[1] and "M params" in lines[2]


def test_the_plan_assumes_the_kernels_a_gpu_run_would_take(tmp_path, monkeypatch):
    """`--plan` resolves kernels as a CUDA machine would with this machine's packages: auto takes liger where
    liger-kernel is installed; an explicit choice stands. liger's kernels keep less, and the plan says which."""
    from trainer.model import kernels

    liger = run_plan(plan_config(tmp_path, kernels="liger"), "--gpus", "8", "--gpu-memory", "139")
    torch_kernels = run_plan(plan_config(tmp_path, kernels="torch"), "--gpus", "8", "--gpu-memory", "139")
    assert "liger kernels" in liger.stdout.splitlines()[4] and "torch kernels" in torch_kernels.stdout.splitlines()[4]
    assert planned_total(liger.stdout) < planned_total(torch_kernels.stdout) - 10
    assert liger.stdout.splitlines()[-1] == "no torch"
    monkeypatch.setattr(kernels, "liger_version", lambda: "0.8.5")
    assert [kernels.on_a_gpu(c) for c in ("auto", "torch", "liger")] == ["liger", "torch", "liger"]
    monkeypatch.setattr(kernels, "liger_version", lambda: None)
    assert kernels.on_a_gpu("auto") == "torch"


def test_a_plan_that_does_not_fit_exits_2_with_one_line_saying_what_to_change(tmp_path):
    unsharded = run_plan(plan_config(tmp_path, shard_optimizer=False, token_budget=49152), "--gpus", "8",
                         "--gpu-memory", "139")
    assert unsharded.returncode == 2 and "does NOT fit 139.0 GiB" in unsharded.stdout
    errors = unsharded.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: memory plan: ")
    assert "shard_optimizer: true" in errors[0] and "more GPUs" in errors[0]
    suggested = int(errors[0].split("token_budget: ")[1].split(",")[0])
    assert 8192 <= suggested < 49152
    assert run_plan(plan_config(tmp_path, shard_optimizer=False, token_budget=suggested), "--gpus", "8",
                    "--gpu-memory", "139").returncode == 0


def test_an_objective_against_the_target_distribution_plans_its_final_states_and_larger_chunks(tmp_path):
    """kl/tv/nla/lk_hybrid keep the target's final hidden states and a chunk holding p beside q: planned, still
    without torch; cap (on the data's labels) plans its own chunk and no target states."""
    from trainer.planning.drafter_bytes import Precision
    from trainer.planning.memory_plan import loss_chunk_bytes

    def plan_of(loss, **values):
        result = run_plan(plan_config(tmp_path, loss=loss, token_budget=8192, **values), "--gpus", "8",
                          "--gpu-memory", "1000")
        assert result.returncode == 0 and result.stdout.splitlines()[-1] == "no torch", result.stderr
        return planned_total(result.stdout), result.stdout.splitlines()[4]

    (ce, ce_line), (kl, kl_line), (cap, cap_line) = plan_of("ce"), plan_of("kl"), plan_of("cap")
    assert "target final states" in kl_line and "target final states" not in ce_line + cap_line
    # 8192 tokens + 8192 block tokens of 5120 bf16 values: 0.16 GiB more than ce (the plan prints 0.1 GiB steps)
    assert kl >= ce + 0.1
    bf16 = Precision.of_run("auto", True)
    assert loss_chunk_bytes("distribution", bf16, 5120, 8192) > loss_chunk_bytes("labels", bf16, 5120, 8192)


def test_the_plan_grows_with_the_budget_and_shrinks_with_the_shards(tmp_path):
    def total(*args, **values) -> float:
        return planned_total(run_plan(plan_config(tmp_path, **values), *args, "--gpu-memory", "1000").stdout)

    assert total("--gpus", "8") < total("--gpus", "8", shard_optimizer=False) == total("--gpus", "1")
    assert total("--gpus", "8") < total("--gpus", "8", token_budget=32768)


def test_start_up_check_refuses_on_every_rank_before_loading(tmp_path):
    from trainer.config import load_config
    from trainer.errors import TrainerError

    cfg = load_config(plan_config(tmp_path))
    said: list[str] = []
    with pytest.raises(TrainerError, match=r"^memory plan: .* does not fit its 100\.0 GiB .*token_budget: \d+"):
        memory_plan.check(cfg, world_size=8, limit=100 * memory_plan.GIB, on_gpu=True,
                          say=lambda *lines: said.extend(lines))
    assert said[0].startswith("Memory plan per GPU (one of 8 ranks)") and len(said) == 6
    fits = memory_plan.check(cfg, world_size=8, limit=139 * memory_plan.GIB, on_gpu=True, say=lambda *lines: None)
    assert fits.fits and fits.ways == 8


def test_a_simulated_rank_plans_rank_0s_share_and_a_real_run_the_largest():
    """With 8 ranks this small drafter's largest share is not rank 0's: the N-GPU plan must cover the largest,
    the one-process simulation holds (and plans) rank 0's."""
    drafter = memory_plan.DrafterSizes(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                       intermediate_size=96, num_taps=2, block_size=8)
    numels = drafter.param_numels()
    shares = [sum(numels[i] for i in part) for part in memory_plan.zero_partition(numels, 8)]
    assert shares[0] < max(shares)
    text = dict(SMALL, model_type="qwen3")
    precision = memory_plan.Precision.of_run("auto", on_gpu=True)
    real, simulated = (memory_plan.plan(text, drafter, tokens=512, block_tokens=512, ways=8, precision=precision,
                                        world_size=8 if not sim else 1, simulated=sim) for sim in (False, True))
    assert (real.optimizer_params, simulated.optimizer_params) == (max(shares), shares[0])
    assert real.optimizer_bytes == 8 * max(shares) and "on the largest rank" in real.lines()[3]
    assert "on rank 0" in simulated.lines()[3] and simulated.lines()[0].startswith("Memory plan per GPU (rank 0 of 8")


def backward_live_bytes(*, intermediate: int, num_layers: int = 2, batch: int = 2, seq_len: int = 512,
                        num_anchors: int = 128) -> tuple[int, int, int]:
    """(the most bytes the backward of one real bf16-autocast drafter step held at once above what was alive when
    its forward ended, the plan's backward working set, one layer's saved tensors: the allowance it replaced).

    Every storage an op creates is counted from its creation until it is freed (a dispatch mode: the caching
    allocator's view, without a GPU). The weights' gradients exist beforehand, as DDP's buckets do (the plan
    counts them whole); what the backward adds to them is counted. The loss runs in chunks of 32 rows, so that
    the forward's logits do not stand in for the backward's own working set."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from trainer.training.objective import dflash_step

    drafter, config = small_drafter(num_layers, torch.bfloat16, intermediate=intermediate)
    for param in drafter.parameters():
        param.grad = torch.zeros_like(param)
    input_ids = torch.randint(0, 499, (batch, seq_len))
    features = torch.randn(batch, seq_len, 3 * 96).bfloat16()

    class LiveBytes(TorchDispatchMode):
        live: dict[int, int] = {}
        now = peak = 0

        def free(self, key):
            self.now -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in tree_flatten(out)[0]:
                storage = tensor.untyped_storage() if isinstance(tensor, torch.Tensor) else None
                if storage is not None and storage.data_ptr() not in self.live and storage.data_ptr() not in known:
                    self.live[storage.data_ptr()] = storage.nbytes()
                    self.now += storage.nbytes()
                    weakref.finalize(storage, self.free, storage.data_ptr())
                    self.peak = max(self.peak, self.now)
            return out

    known = {t.untyped_storage().data_ptr() for p in drafter.parameters() for t in (p, p.grad)}
    known |= {t.untyped_storage().data_ptr() for t in (drafter.embed_tokens.weight, drafter.lm_head.weight, features)}
    with LiveBytes() as tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = dflash_step(drafter, features, input_ids, torch.ones_like(input_ids), num_anchors=num_anchors,
                              block_size=8, gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(0),
                              chunk_rows=32)
        end_of_forward = tracker.peak = tracker.now
        out.loss.backward()
    sizes = memory_plan.DrafterSizes.from_drafter_config(config.to_hf_dict())
    precision, blocks = memory_plan.Precision(target=2, act=2, casts=True), batch * num_anchors * 8
    plan = drafter_bytes.backward_working_bytes(sizes, precision, context_tokens=batch * seq_len, block_tokens=blocks)
    per_query, per_key = drafter_bytes.saved_bytes_per_layer(sizes, precision)
    return tracker.peak - end_of_forward, plan, per_query * blocks + per_key * (batch * seq_len + blocks)


@pytest.mark.parametrize("ratio", [3, 6, 12], ids=lambda r: f"intermediate-{r}x-hidden")
def test_the_backward_working_set_covers_what_the_torch_backward_holds(ratio):
    """The torch path's backward holds little above the saved tensors (the final RMSNorm's fp32 temporaries, or
    the SwiGLU's gradients when the MLP is wide): the plan covers it, within 2 x; one layer's saved tensors, the
    allowance it replaced, were 3 x and more of it. 2,048 block tokens, so that one weight's gradient weighs as
    little against the activations as at a real budget."""
    measured, plan, one_layer = backward_live_bytes(intermediate=96 * ratio)
    assert 0 < measured <= plan <= 2 * measured, (measured, plan)
    assert one_layer > 2.5 * measured


def test_the_liger_stand_ins_compute_what_they_stand_in_for():
    """Their gradients are their forwards' (gradcheck in float64), and their forwards the drafter's torch code."""
    import torch

    from trainer.model.drafter import RMSNorm

    modules = liger_stand_ins()
    norm, silu_mul = (modules["liger_kernel.ops.rms_norm"].LigerRMSNormFunction,
                      modules["liger_kernel.ops.swiglu"].LigerSiLUMulFunction)
    x, w = (torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True),
            torch.randn(16, dtype=torch.float64, requires_grad=True))
    a, b = (torch.randn(4, 9, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda x, w: norm.apply(x, w, 1e-6, 0.0, "llama", False), (x, w))
    assert torch.autograd.gradcheck(silu_mul.apply, (a, b))
    module = RMSNorm(16, 1e-6)
    with torch.no_grad():
        module.weight.copy_(w.float())
    torch.testing.assert_close(norm.apply(x.float(), module.weight, 1e-6, 0.0, "llama", False), module(x.float()))
    torch.testing.assert_close(silu_mul.apply(a, b), torch.nn.functional.silu(a) * b)


# peaks measured on one H200 (torch.cuda.max_memory_allocated, bf16 autocast, the seed's buckets, packed target),
# bench/RESULTS.md, 2026-12-02: the qwen3-8b shape at 49,152 tokens and 3,072 anchors on one GPU (unsharded
# AdamW), and the qwen3.6-27b shape at 24,576 tokens / 1,536 anchors and at 49,152 / 3,072 as rank 0 of 8 (AdamW
# sharded 8 ways)
H200_PEAKS_GIB = {("qwen3-8b", "torch"): 90.1, ("qwen3-8b", "liger"): 70.5, ("qwen3.6-27b", "liger"): 94.5,
                  ("qwen3.6-27b@49152", "liger"): 120.2}


def bench_plan(shape: str, kernels: str) -> memory_plan.MemoryPlan:
    """The plan of the bench's run of `shape` (bench/bench_train.py's defaults and the commands of RESULTS.md)."""
    from bench.synthetic import SHAPES

    if shape == "qwen3-8b":
        text = dict(SHAPES["qwen3-8b"], model_type="qwen3", tie_word_embeddings=False)
        budgets = dict(token_budget=49152, anchor_budget=3072, target_layer_ids=[1, 9, 17, 25, 33])
    else:
        tokens = int(shape.partition("@")[2] or 24576)
        text, budgets = QWEN36_27B, dict(token_budget=tokens, anchor_budget=tokens // 16, target_layer_ids=TAPS_27B,
                                         simulate_shards=8)
    cfg = run_config("unused", num_anchors=512, block_size=16, drafter_layers=5, **budgets)
    return memory_plan.config_plan(cfg, world_size=1, limit=None, on_gpu=True, spec=target_spec(text), kernels=kernels)


@pytest.mark.parametrize("shape, kernels", sorted(H200_PEAKS_GIB))
def test_the_plan_covers_the_h200_peaks_and_liger_s_within_25_percent(shape, kernels):
    """A plan under the measured peak would let a run out of memory mid-way; one far above it refuses budgets
    that fit. The liger plans stay within 25 % above the peaks. The peaks: bench/RESULTS.md, one H200,
    2026-12-02 (the `packed`, `packed+liger` rows of the qwen3-8b shape; the qwen3.6-27b rank 0 of 8)."""
    planned = (bench_plan(shape, kernels).total - memory_plan.RESERVE_BYTES) / memory_plan.GIB
    measured = H200_PEAKS_GIB[shape, kernels]
    assert planned >= measured, (planned, measured)
    if kernels == "liger":
        assert planned <= 1.25 * measured, (planned, measured)
    assert bench_plan(shape, "liger").total < bench_plan(shape, "torch").total


def test_train_asks_for_expandable_segments_unless_the_user_configured_the_allocator():
    from trainer.training.startup import default_cuda_allocator

    env: dict[str, str] = {}
    assert default_cuda_allocator(env) == "expandable_segments:True" == env["PYTORCH_CUDA_ALLOC_CONF"]
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert default_cuda_allocator(mine) == "max_split_size_mb:512" == mine["PYTORCH_CUDA_ALLOC_CONF"]
