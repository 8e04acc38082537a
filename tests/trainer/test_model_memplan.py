"""The memory plan: target parameter counts against the models transformers builds, the ZeRO partition against
ZeroRedundancyOptimizer's, the activation estimate against what autograd really saves, and `train --plan`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO_ROOT, trainer_env, write_config
from trainer import memplan
from trainer.config import TrainConfig
from trainer.families import read_target_spec, target_spec
from trainer.targetsize import target_params

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

    from trainer.drafter import DFlashDrafter, DrafterConfig
    from trainer.families import drafter_shape
    from trainer.target import TargetModel
    from trainer.tiny import write_tiny_target

    path = write_tiny_target(tmp_path / "target", family=family, composite=composite)
    target = TargetModel.load(path, layer_ids=None, num_taps=2)
    spec = read_target_spec(path)
    assert target_params(spec.text) == sum(p.numel() for p in target.hf_model.parameters())
    cfg = run_config(path, drafter_layers=2, block_size=8, drafter_intermediate_size=72)
    shape = drafter_shape(spec, intermediate_size=72)
    config = DrafterConfig.from_target(target.config, num_layers=2, block_size=8, target_layer_ids=target.layer_ids,
                                       mask_token_id=target.mask_token_id, shape=shape)
    drafter = DFlashDrafter(config, embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    sizes = memplan.DrafterSizes.for_run(spec, cfg, num_taps=2)
    assert sizes.param_numels() == [p.numel() for p in drafter.parameters()]
    assert memplan.DrafterSizes.from_drafter_config(config.to_hf_dict()) == sizes
    linear = sum(m.weight.numel() for m in drafter.modules() if isinstance(m, torch.nn.Linear))
    assert sizes.matmul_params() == linear


def test_a_composite_checkpoint_counts_its_language_model_only():
    composite = {"model_type": "qwen3_5", "vision_config": {"hidden_size": 1152, "depth": 27},
                 "text_config": QWEN36_27B}
    assert target_params(target_spec(composite).text) == target_params(QWEN36_27B)
    assert round(target_params(QWEN36_27B) / 1e9, 2) == 26.90


def test_the_27b_drafter_is_the_public_recipe():
    sizes = memplan.DrafterSizes.for_run(target_spec(QWEN36_27B), run_config("unused", block_size=16), num_taps=5)
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

    numels = memplan.DrafterSizes.for_run(target_spec(QWEN36_27B), run_config("unused", block_size=16),
                                          num_taps=5).param_numels()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ways)
    try:
        params = [torch.nn.Parameter(torch.empty(n, device="meta")) for n in numels]
        zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)
        index = {id(p): i for i, p in enumerate(params)}
        theirs = [sorted(index[id(p)] for g in groups for p in g["params"]) for groups in zero._partition_parameters()]
    finally:
        dist.destroy_process_group()
    assert memplan.zero_partition(numels, ways) == theirs


# ---------------------------------------------------------------------------------------------- activations

def saved_tensor_bytes(*, autocast: bool, num_layers: int, batch: int, seq_len: int, num_anchors: int):
    """(bytes autograd keeps for one real drafter step, the plan's estimate of them, context and block tokens).

    Counted once per storage; left out: parameters, the target's features (planned on their own) and the dense
    mask SDPA keeps on the CPU (flex_attention on a GPU keeps a block mask of a few KiB instead)."""
    import torch

    from trainer.drafter import DFlashDrafter, DrafterConfig
    from trainer.objective import dflash_step

    from transformers import Qwen3Config

    low = torch.bfloat16 if autocast else torch.float32
    target = Qwen3Config(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=200, rms_norm_eps=1e-6, vocab_size=500, max_position_embeddings=4096,
                         num_hidden_layers=12)
    config = DrafterConfig.from_target(target, num_layers=num_layers, block_size=8, target_layer_ids=[1, 4, 7],
                                       mask_token_id=499)
    torch.manual_seed(0)
    embed, head = torch.nn.Embedding(500, 96).to(low), torch.nn.Linear(96, 500, bias=False).to(low)
    drafter = DFlashDrafter(config, embed_tokens=embed, lm_head=head)
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
    sizes = memplan.DrafterSizes.from_drafter_config(config.to_hf_dict())
    precision = memplan.Precision(target=2, act=2, casts=True) if autocast else memplan.Precision(4, 4, False)
    estimate = memplan.drafter_saved_bytes(sizes, precision, context_tokens=batch * seq_len, block_tokens=blocks)
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
    assert "24576 tokens, 24576 block tokens" in lines[4]
    assert lines[-1] == "no torch"   # nothing loaded, not even torch


def test_a_plan_that_does_not_fit_exits_2_with_one_line_saying_what_to_change(tmp_path):
    unsharded = run_plan(plan_config(tmp_path, shard_optimizer=False, token_budget=32768), "--gpus", "8",
                         "--gpu-memory", "139")
    assert unsharded.returncode == 2 and "does NOT fit 139.0 GiB" in unsharded.stdout
    errors = unsharded.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: memory plan: ")
    assert "shard_optimizer: true" in errors[0] and "more GPUs" in errors[0]
    suggested = int(errors[0].split("token_budget: ")[1].split(",")[0])
    assert 8192 <= suggested < 32768
    assert run_plan(plan_config(tmp_path, shard_optimizer=False, token_budget=suggested), "--gpus", "8",
                    "--gpu-memory", "139").returncode == 0


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
        memplan.check(cfg, world_size=8, limit=100 * memplan.GIB, on_gpu=True, say=lambda *lines: said.extend(lines))
    assert said[0].startswith("Memory plan per GPU (one of 8 ranks)") and len(said) == 6
    fits = memplan.check(cfg, world_size=8, limit=139 * memplan.GIB, on_gpu=True, say=lambda *lines: None)
    assert fits.fits and fits.ways == 8


def test_a_simulated_rank_plans_rank_0s_share_and_a_real_run_the_largest():
    """With 8 ranks this small drafter's largest share is not rank 0's: the N-GPU plan must cover the largest,
    the one-process simulation holds (and plans) rank 0's."""
    drafter = memplan.DrafterSizes(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                   intermediate_size=96, num_taps=2, block_size=8)
    numels = drafter.param_numels()
    shares = [sum(numels[i] for i in part) for part in memplan.zero_partition(numels, 8)]
    assert shares[0] < max(shares)
    text = dict(SMALL, model_type="qwen3")
    precision = memplan.Precision.of_run("auto", on_gpu=True)
    real, simulated = (memplan.plan(text, drafter, tokens=512, block_tokens=512, ways=8, precision=precision,
                                    world_size=8 if not sim else 1, simulated=sim) for sim in (False, True))
    assert (real.optimizer_params, simulated.optimizer_params) == (max(shares), shares[0])
    assert real.optimizer_bytes == 8 * max(shares) and "on the largest rank" in real.lines()[3]
    assert "on rank 0" in simulated.lines()[3] and simulated.lines()[0].startswith("Memory plan per GPU (rank 0 of 8")
