"""The throughput benchmark's CPU smoke mode as a real process, the model-FLOP count against hand counts, and
the pieces of the step that must never wait for the GPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bench.flops import LayerShape, StepFlops, drafter_step_flops, target_feature_flops, training_step_flops
from tests.trainer.conftest import REPO_ROOT, trainer_env
from tests.trainer.tiny_models import (  # noqa: F401  (fixtures)
    device, make_drafter, random_ids, tiny_target, tiny_target_dir)

# H=8, 2 heads of 4, 1 KV head, MLP 16, vocabulary 10. Per token and layer, by hand:
#   q_proj 2*8*8 = 128, o_proj 128, MLP 3 * 2*8*16 = 768  -> 1024 on the query side
#   k_proj 2*8*4 = 64, v_proj 64                           -> 128 on the key side
#   one (query, key) pair: q.k and p.v, 2 heads of 4      -> 2 * 2 * 2*4 = 32
SMALL = LayerShape(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, intermediate_size=16, vocab_size=10)


def test_target_flops_match_a_hand_count():
    # lengths 3 and 2: 5 tokens * 1152 = 5760; causal pairs 6 + 3 = 9, * 32 = 288; two layers
    assert target_feature_flops(SMALL, num_layers=2, lengths=[3, 2]) == 2 * (5760 + 288) == 12096


def test_drafter_flops_match_a_hand_count():
    # one layer, two taps, blocks of 3 at anchors 1 and 3 (the -1 is padding) over a 6-token context
    flops = drafter_step_flops(SMALL, num_layers=1, num_taps=2, block_size=3, context_lengths=[6],
                               anchors=[[1, 3, -1]])
    fc = 2 * 16 * 8 * 6                                  # 1536
    layer = 6 * 1024 + (6 + 6) * 128 + (3 * 4 + 3 * 6) * 32  # 6 slots; 12 keys; pairs: anchor + 3 each
    assert (flops.drafter_forward, flops.drafter_backward) == (fc + layer, fc + 2 * layer) == (10176, 18816)
    assert flops.lm_head_forward == flops.lm_head_backward == 2 * 8 * 10 * 2 * 2 == 640
    assert flops.drafter_total == 30272 and flops.target == 0


def test_dflash2_flops_add_the_kernel_projections_and_the_selector_by_hand():
    from trainer.planning.dflash2 import Dflash2Sizes

    sizes = Dflash2Sizes(conv_kernel_size=2, conv_group_size=4, selector_rank=3, selector_top_k=2)
    plain = drafter_step_flops(SMALL, num_layers=1, num_taps=2, block_size=3, context_lengths=[6],
                               anchors=[[1, 3, -1]])
    flops = drafter_step_flops(SMALL, num_layers=1, num_taps=2, block_size=3, context_lengths=[6],
                               anchors=[[1, 3, -1]], dflash2=sizes)
    conv = 6 * 2 * 2 * 8 * (2 * 2 * 8 // 4)   # 6 slots, 2 convolutions, a [8 -> 8] projection each: 1536
    selector = 4 * (2 * 8 * 3 + 2 * 2 * 3)      # 4 drafted slots: hidden projection and 2 candidates' scores: 240
    assert flops.drafter_forward - plain.drafter_forward == conv + selector == 1776
    assert flops.drafter_backward - plain.drafter_backward == 2 * conv + selector
    assert flops.lm_head_forward == plain.lm_head_forward


def test_step_flops_add_the_target_and_sum_over_steps():
    one = training_step_flops(SMALL, SMALL, target_layers=2, drafter_layers=1, num_taps=2, block_size=3,
                              lengths=[6], anchors=[[1, 3, -1]])
    assert one.target == target_feature_flops(SMALL, num_layers=2, lengths=[6])
    assert one.total == one.target + 30272
    assert (one + one).total == 2 * one.total and (one + StepFlops(0, 0, 0, 0, 0)) == one


def test_an_objective_against_the_target_distribution_adds_its_last_layers_and_head():
    # a 3-layer target tapped through 2 layers: the third over 6 tokens (6 * 1152 + 21 pairs * 32 = 7584) and
    # the LM head at the 2 slots of each of the 2 real blocks (2 * 8 * 10 * 4 = 640)
    plain = training_step_flops(SMALL, SMALL, target_layers=2, drafter_layers=1, num_taps=2, block_size=3,
                                lengths=[6], anchors=[[1, 3, -1]])
    against_p = training_step_flops(SMALL, SMALL, target_layers=2, drafter_layers=1, num_taps=2, block_size=3,
                                    lengths=[6], anchors=[[1, 3, -1]], total_layers=3)
    assert plain.target_distribution == 0 and against_p.target_distribution == 7584 + 640
    assert against_p.total == plain.total + 8224


def test_per_token_counts_equal_twice_the_real_layer_parameters():
    """The per-token terms against a real drafter layer's weights: 2 FLOPs per weight per token."""
    from types import SimpleNamespace

    from trainer.model.drafter import DrafterConfig, DrafterLayer

    config = DrafterConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=4, intermediate_size=16, rms_norm_eps=1e-6, rope_theta=1e4, vocab_size=10,
                           max_position_embeddings=64, block_size=3, num_target_layers=4,
                           target_layer_ids=[1, 2], mask_token_id=9)
    layer = DrafterLayer(config, "full_attention")
    attn, mlp = layer.self_attn, layer.mlp
    query_side = sum(m.weight.numel() for m in (attn.q_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    key_side = attn.k_proj.weight.numel() + attn.v_proj.weight.numel()
    shape = LayerShape.from_config(SimpleNamespace(**config.as_dict()))
    assert (shape.query_side_flops(), shape.key_side_flops()) == (2 * query_side, 2 * key_side)


def run_bench(*args: str) -> dict:
    result = subprocess.run([sys.executable, "bench/bench_train.py", *args], capture_output=True, text=True,
                            timeout=240, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_tiny_cpu_benchmark_reports_every_figure():
    result = run_bench("--tiny", "--device", "cpu", "--steps", "2", "--variants", "legacy,packed", "--json")
    step, target = result["step"], result["target_only"]
    # before/after rows of one run, on the same batches; the summary is the last variant's
    assert [row["variant"] for row in result["variants"]] == ["legacy", "packed"]
    assert all(row["tok_per_s"] > 0 and row["mfu"] > 0 and row["drafter_tflops"] > 0 for row in result["variants"])
    assert result["variants"][-1]["tok_per_s"] == step["tok_per_s"]
    assert 0 < step["target_padding_share"] < 1 and step["mfu_datasheet"] is None     # no datasheet for a CPU
    # the baseline of "the same packed tokens": the HF decoder's own forward over the packed batches
    assert result["plain_forward_packed"]["tok_per_s"] > 0 and step["target_phase_vs_plain_packed"] > 0
    assert result["device"] == "cpu" and result["model"] == "tiny" and result["world_size"] == 1
    assert result["taps"] == [1, 2, 3, 4, 5]           # 5 taps spread over layers 1..N-3 of 8 layers
    assert result["matmul_peak_tflops"] > 0 and result["peak_memory_gib"] > 0
    assert target["tok_per_s"] > 0 and step["tok_per_s"] > 0 and 0 < step["mfu"] and 0 < target["mfu"]
    assert set(step["phase_share"]) == {"data", "target", "drafter_forward", "backward", "optimizer"}
    assert sum(step["phase_share"].values()) == pytest.approx(1.0)
    assert all(share > 0 for share in step["phase_share"].values())
    flops = step["flops_per_step"]
    assert flops["total"] == pytest.approx(flops["target"] + flops["drafter_total"])
    assert step["target_flop_share"] == pytest.approx(flops["target"] / flops["total"])
    assert step["target_flop_share"] + step["drafter_flop_share"] == pytest.approx(1.0)
    assert flops["lm_head_forward"] == flops["lm_head_backward"] > 0
    assert step["target_in_step_ratio"] > 0 and step["loss"] > 0
    assert result["compiled_frames_after_warmup"] == 0        # eager: nothing compiles at all


def test_the_target_phase_is_timed_in_each_precision_on_the_same_batches():
    """--target-precision bf16,fp8 (fp8 emulated off a GPU): each row's time, the second's speed-up and the tapped
    states' relative error against the first, per tap."""
    rows = run_bench("--tiny", "--device", "cpu", "--steps", "2", "--target-precision", "bf16,fp8")["target_precision"]
    assert [row["precision"] for row in rows] == ["bf16", "fp8 (emulated)"]
    assert all(row["target_ms_per_batch"] > 0 and row["tokens"] == rows[0]["tokens"] for row in rows)
    assert rows[1]["speedup_vs_first"] > 0 and 0 < rows[1]["features_relative_error"] < 0.25
    assert len(rows[1]["per_tap_relative_error"]) == 5


def test_the_target_phase_is_timed_with_its_layers_compiled_too():
    """`+compiled`: the same precision with the decoder layers compiled (the features those layers give equal the
    eager ones in fp32); bf16 rows come before fp8 ones, which convert the target in place."""
    from bench.target_precision import parse_precisions

    rows = run_bench("--tiny", "--device", "cpu", "--steps", "2",
                     "--target-precision", "bf16,bf16+compiled")["target_precision"]
    assert [row["precision"] for row in rows] == ["bf16", "bf16+compiled"]
    assert rows[1]["speedup_vs_first"] > 0 and rows[1]["features_relative_error"] < 1e-4
    assert parse_precisions("bf16,fp8+compiled,fp8") == ["bf16", "fp8+compiled", "fp8"]
    with pytest.raises(ValueError, match="bf16 comes before fp8"):
        parse_precisions("fp8,bf16+compiled")


def test_dflash2_is_measured_against_dflash_on_the_same_batches():
    result = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--skip-baselines",
                       "--block-size", "8", "--architecture", "dflash,dflash2", "--json")
    rows = result["variants"]
    assert [(row["variant"], row["architecture"]) for row in rows] == [("dflash/auto", "dflash"),
                                                                        ("dflash2/auto", "dflash2")]
    assert rows[0]["tok_per_s_vs_first"] == 1.0 and rows[1]["tok_per_s_vs_first"] > 0
    assert all(row["mfu"] > 0 for row in rows) and result["architecture"] == "dflash2"


def test_the_loss_option_times_an_objective_against_the_target_distribution():
    result = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--skip-baselines", "--loss",
                       '{"ce": 0.5, "kl": 0.5}', "--json")
    flops = result["step"]["flops_per_step"]
    assert result["objective"] == "0.5*ce + 0.5*kl, dpace slot weights"    # the trainer's default slot weights
    assert flops["target_distribution"] > 0 and result["step"]["distribution_flop_share"] > 0
    assert flops["total"] == pytest.approx(flops["target"] + flops["target_distribution"] + flops["drafter_total"])
    bad = subprocess.run([sys.executable, "bench/bench_train.py", "--tiny", "--loss", "kll"], capture_output=True,
                         text=True, timeout=120, env=trainer_env(), cwd=REPO_ROOT)
    assert bad.returncode == 2 and "--loss: unknown objective 'kll' (did you mean 'kl'?)" in bad.stderr


def test_named_objectives_are_measured_one_after_the_other_on_the_same_drafter():
    result = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--skip-baselines",
                       "--objectives", "ce,0.5ce+0.5kl", "--json")
    rows = result["variants"]
    assert [(row["variant"], row["objective"]) for row in rows] == [
        ("ce/auto", "ce, decay slot weights"), ("0.5ce+0.5kl/auto", "0.5*ce + 0.5*kl, decay slot weights")]
    assert rows[0]["tok_per_s_vs_first"] == 1.0 and rows[1]["tok_per_s_vs_first"] > 0
    # the target is built whole for the objective that reads its distribution
    assert result["step"]["flops_per_step"]["target_distribution"] > 0
    bad = subprocess.run([sys.executable, "bench/bench_train.py", "--tiny", "--objectives", "ce,dflash2"],
                         capture_output=True, text=True, timeout=120, env=trainer_env(), cwd=REPO_ROOT)
    assert bad.returncode == 2 and "unknown objective(s) dflash2" in bad.stderr


def test_an_unknown_variant_is_a_usage_error():
    result = subprocess.run([sys.executable, "bench/bench_train.py", "--tiny", "--variants", "packed,fastest"],
                            capture_output=True, text=True, timeout=120, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 2 and "unknown variant(s) fastest" in result.stderr


def test_anchor_budget_caps_the_blocks_per_batch():
    """Blocks per batch follow --anchor-budget: fewer blocks, a smaller drafter share of the FLOPs."""
    wide = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--json")
    capped = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--anchor-budget", "8",
                       "--json")
    assert capped["anchor_budget"] == 8
    assert capped["step"]["flops_per_step"]["target"] == wide["step"]["flops_per_step"]["target"]
    assert capped["step"]["flops_per_step"]["drafter_total"] < wide["step"]["flops_per_step"]["drafter_total"]


def test_simulated_shards_report_the_plan_beside_the_measured_peak():
    """--simulate-shards: the whole target is built (as the trainer loads it) and the result holds rank 0's plan
    of the 8-GPU run and the peak measured against it."""
    whole = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--json")
    result = run_bench("--tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--simulate-shards", "8",
                       "--json")
    plan = result["memory_plan"]
    assert "memory_plan" not in whole
    assert plan["lines"][0].startswith("Memory plan ") and "(rank 0 of 8, simulated): " in plan["lines"][0]
    assert "sharded 8 ways" in plan["lines"][3] and plan["lines"][-1].startswith("  measured    peak allocated")
    # a CPU process plans no CUDA context reserve: the total is what the process holds
    assert 0 < plan["without_reserve_gib"] <= plan["total_gib"] and plan["peak_allocated_gib"] > 0
    assert plan["fits"] and set(plan["activations_gib"]) <= {"features", "saved", "working", "target layer"}


# ---------------------------------------------------------------------------------------------- sync-free step

def test_anchor_width_depends_on_the_shape_only():
    from trainer.training.objective import sample_anchors

    loss_mask = torch.zeros(3, 30, dtype=torch.long)
    loss_mask[0, 2:6] = 1          # 3 valid anchors
    loss_mask[2, :] = 1            # 29 valid anchors
    anchors = sample_anchors(loss_mask, 10, torch.Generator().manual_seed(0))
    assert anchors.shape == (3, 10)
    assert anchors[0].tolist() == [2, 3, 4] + [-1] * 7 and anchors[1].tolist() == [-1] * 10
    row = anchors[2].tolist()
    assert row == sorted(row) and len(set(row)) == 10 and all(0 <= a <= 28 for a in row)
    assert sample_anchors(loss_mask, 100, torch.Generator()).shape == (3, 29)


def test_a_batch_without_supervised_slots_gives_zero_loss_and_zero_gradients(tiny_target):
    from trainer.training.objective import dflash_step

    drafter = make_drafter(tiny_target, num_layers=1, block_size=4)
    input_ids = random_ids(tiny_target, (2, 12), seed=0)
    loss_mask = torch.zeros_like(input_ids)
    out = dflash_step(drafter, tiny_target.features(input_ids), input_ids, loss_mask, num_anchors=4,
                      block_size=4, gamma=4.0, noise=0.0, generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.acc.item() == 0.0 and out.streak.item() == 0.0
    assert int(out.n_supervised) == 0 and int(out.n_blocks) == 0
    grads = [p.grad for p in drafter.parameters()]
    assert all(g is not None and torch.equal(g, torch.zeros_like(g)) for g in grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_objective_pieces_never_wait_for_the_gpu():
    from trainer.training.objective import (accepted_streak, block_labels, chunked_weighted_ce, decay_weights,
                                            sample_anchors)

    loss_mask = torch.ones(4, 300, dtype=torch.long, device="cuda")
    input_ids = torch.randint(0, 50, (4, 300), device="cuda")
    hidden = torch.randn(4 * 32 * 7, 16, device="cuda", requires_grad=True)
    weight = torch.randn(50, 16, device="cuda")
    generator = torch.Generator().manual_seed(0)
    sample_anchors(loss_mask, 32, generator)          # first use: pinned-memory pool, kernels load
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        anchors = sample_anchors(loss_mask, 32, generator)
        labels = block_labels(input_ids, loss_mask, anchors, 8)
        weights = (decay_weights(8, 4.0, device="cuda") * (labels != -100)).flatten()
        loss, correct, _, _ = chunked_weighted_ce(hidden, weight, labels.clamp(min=0).flatten(), weights,
                                                  chunk_rows=100)
        accepted_streak(correct.view(labels.shape), labels).sum()
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(hidden.grad).all()


def test_loss_benchmark_compares_with_the_previous_loss_and_its_floor():
    result = subprocess.run([sys.executable, "bench/bench_loss.py", "--rows", "600", "--hidden", "32", "--vocab",
                             "3000", "--device", "cpu", "--repeat", "2"],
                            capture_output=True, text=True, timeout=240, env=trainer_env(gpu=True), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["loss_ms"] > 0 and figures["floor_ms"] > 0 and figures["previous_ms"] > 0
    assert figures["loss_over_floor"] == pytest.approx(figures["loss_ms"] / figures["floor_ms"])
    # fp32 on the CPU: the two versions of the loss compute the same numbers
    assert figures["loss_difference"] < 1e-5 and figures["grad_relative_difference"] < 1e-5


def test_objective_loss_benchmark_times_each_objective_beside_the_previous_chunk_loop():
    result = subprocess.run([sys.executable, "bench/bench_objective_loss.py", "--blocks", "16", "--hidden", "16",
                             "--vocab", "500", "--device", "cpu", "--repeat", "1"],
                            capture_output=True, text=True, timeout=240, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)["objectives"]
    assert set(figures) == {"ce", "ce+dpace", "kl", "lk_hybrid"} and all(row["ms"] > 0 for row in figures.values())
    for name in ("kl", "lk_hybrid"):   # the one-pass chunks compute what the previous loop did
        assert figures[name]["previous_ms"] > 0 and figures[name]["loss_difference"] < 1e-5
        assert figures[name]["grad_relative_difference"] < 1e-3


@pytest.mark.slow
def test_startup_benchmark_reports_stages_and_step_times_on_the_cpu(tmp_path):
    """bench_startup as a real process on the tiny shape: the trainer's start-up stages, the time from the loaded
    target to step 1's line, and a time for every step after the first."""
    done = subprocess.run([sys.executable, "bench/bench_startup.py", "--shape", "tiny", "--device", "cpu",
                           "--steps", "5", "--samples", "200", "--max-len", "256", "--workdir", str(tmp_path),
                           "--json"], cwd=REPO_ROOT, env=trainer_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exit_code"] == 0
    assert list(report["stages_s"]) == ["loading target", "building drafter", "first step"]
    assert 0 < report["target_loaded_to_first_step_s"] < report["first_step_line_s"]
    assert sorted(map(int, report["step_s"])) == [2, 3, 4, 5] and report["median_step_s"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_the_target_attention_benchmark_says_in_one_line_that_it_needs_a_gpu():
    result = subprocess.run([sys.executable, "bench/bench_target_attention.py"], capture_output=True, text=True,
                            timeout=120, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 2 and result.stderr.strip() == "bench_target_attention: needs a CUDA GPU"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_target_attention_benchmark_times_flash_on_a_gpu():
    result = subprocess.run([sys.executable, "bench/bench_target_attention.py", "--tokens", "4096", "--repeat", "2"],
                            capture_output=True, text=True, timeout=240, env=trainer_env(gpu=True), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    flash, copied = report["kernels"][:2]
    assert flash["kernel"] == "flash varlen (now)" and flash["ms"] > 0 and flash["max_abs_difference"] == 0
    # the views and grouped heads give what contiguous copies with repeated heads give, up to bf16's rounding
    assert copied["ms"] > 0 and copied["max_abs_difference"] < 2e-2 and isinstance(report["lean_inputs"], bool)


def test_dflash2_parts_benchmark_times_each_part_on_the_cpu():
    """bench_dflash2_parts.py's smoke mode as a real process: one JSON row per part and way, each a positive time
    (on a CPU only the eager convolution: the compiled ways are a GPU's)."""
    result = subprocess.run([sys.executable, "bench/bench_dflash2_parts.py", "--tiny", "--device", "cpu"],
                            capture_output=True, text=True, timeout=240, env=trainer_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["how"] for row in rows] == ["torch.topk (before)", "blockwise (now)", "eager"]
    assert all(row["ms"] > 0 for row in rows)
