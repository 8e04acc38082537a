"""Qwen3.5/3.6-style hybrid targets (Gated DeltaNet + gated full attention), dense and MoE, text-only and
composite image-text checkpoints: what the trainer reads of them, and the features it taps."""
from __future__ import annotations

import json

import pytest
import torch

from trainer.errors import TrainerError
from trainer.model.target import TargetModel
from trainer.planning.target_families import LINEAR, read_target_spec, target_spec

KINDS = [("qwen3.5", False), ("qwen3.5", True), ("qwen3.5-moe", False), ("qwen3.5-moe", True)]


@pytest.fixture(scope="module", params=KINDS, ids=lambda kind: kind[0] + ("-composite" if kind[1] else ""))
def hybrid_dir(request, tmp_path_factory):
    from trainer.model.tiny_target import write_tiny_target

    family, composite = request.param
    return write_tiny_target(tmp_path_factory.mktemp("hybrid") / "target", family=family, composite=composite)


def test_spec_reads_the_text_model_of_every_kind(hybrid_dir):
    spec = read_target_spec(hybrid_dir)
    raw = json.loads((hybrid_dir / "config.json").read_text())
    assert spec.composite == ("text_config" in raw)
    assert spec.family == "qwen3_5" and spec.model_type.endswith("_text")
    assert spec.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    assert spec.count(LINEAR) == 6 and spec.count(LINEAR, upto=4) == 3


def _hf_tapped_states(target, input_ids, attention_mask=None):
    out = target.hf_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in target.layer_ids], dim=-1)


def test_features_equal_hf_hidden_states_at_the_taps(hybrid_dir):
    target = TargetModel.load(hybrid_dir, layer_ids=[1, 3, 5], num_taps=3, dtype=torch.float32)
    # the language model only: no vision tower in memory
    assert not any("visual" in name for name, _ in target.hf_model.named_parameters())
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, target.config.vocab_size, (2, 40), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 29:] = 0
    with torch.no_grad():
        expected = _hf_tapped_states(target, input_ids)
        expected_padded = _hf_tapped_states(target, input_ids, attention_mask)
    torch.testing.assert_close(target.features(input_ids), expected, rtol=1e-5, atol=1e-5)
    real = attention_mask.bool()
    got = target.features(input_ids, attention_mask)
    torch.testing.assert_close(got[real], expected_padded[real], rtol=1e-5, atol=1e-5)


def test_the_final_states_past_the_last_tap_give_the_targets_own_logits(hybrid_dir):
    """Objectives against the target's distribution run its layers past the last tap (here linear-attention
    layers 4-6 and the full-attention layer 7) in the feature pass: the LM head over its final states gives the
    model's own logits, padded rows too."""
    target = TargetModel.load(hybrid_dir, layer_ids=[1, 3], num_taps=2, dtype=torch.float32)
    input_ids = torch.randint(0, target.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 25:] = 0
    features, final = target.features(input_ids, attention_mask, final=True)
    real = attention_mask.bool()
    torch.testing.assert_close(features[real], target.features(input_ids, attention_mask)[real])
    with torch.no_grad():
        expected = target.hf_model(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(target.lm_head(final)[real], expected[real], rtol=1e-4, atol=1e-4)


def test_composite_checkpoint_loads_its_language_model_weights(tmp_path):
    from safetensors.torch import load_file

    from trainer.model.tiny_target import write_tiny_target

    path = write_tiny_target(tmp_path / "c", family="qwen3.5", composite=True, seed=5)
    stored = load_file(path / "model.safetensors")
    target = TargetModel.load(path, layer_ids=[2, 3], num_taps=2)
    loaded = target.hf_model.state_dict()
    text_keys = [key for key in stored if key.startswith("model.language_model.")]
    assert len(text_keys) > 40 and any(key.startswith("model.visual.") for key in stored)
    for key in text_keys:  # every stored language-model tensor, under the text model's own name
        torch.testing.assert_close(loaded[key.replace("model.language_model.", "model.")], stored[key],
                                   rtol=0, atol=0)
    torch.testing.assert_close(loaded["lm_head.weight"], stored["lm_head.weight"], rtol=0, atol=0)


def test_start_up_line_names_each_layer_type_and_its_kernel(hybrid_dir):
    target = TargetModel.load(hybrid_dir, layer_ids=[1, 3, 5], num_taps=3)
    line = target.describe()
    kernel = target.kernels()[LINEAR]
    assert kernel in ("fla", "torch")
    family = "qwen3_5_moe" if "moe" in target.spec.model_type else "qwen3_5"
    assert line.startswith(f"Target: {family} ")
    assert f"6 linear-attention layers ({kernel}), 2 full-attention (sdpa), taps [1, 3, 5]" in line


def test_kernel_is_torch_without_fla_here(hybrid_dir):
    import importlib.util

    if importlib.util.find_spec("fla") is not None:
        pytest.skip("flash-linear-attention is installed here")
    assert TargetModel.load(hybrid_dir, layer_ids=[1], num_taps=1).kernels()[LINEAR] == "torch"


@pytest.mark.parametrize("config, named", [
    ({"model_type": "gpt2", "n_layer": 12}, "'gpt2'"),
    ({"model_type": "mamba", "num_hidden_layers": 24}, "'mamba'"),
    ({"num_hidden_layers": 4}, "(none)"),
])
def test_unsupported_targets_are_named_with_what_is_supported(config, named):
    with pytest.raises(TrainerError) as caught:
        target_spec(config)
    message = str(caught.value)
    assert named in message and "qwen3_5" in message and "llama" in message and "\n" not in message


def test_unsupported_target_is_refused_before_any_weight_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (tmp_path / "model.safetensors").write_text("not weights at all")  # reading it would fail differently
    with pytest.raises(TrainerError, match="model_type 'gpt2' is not a supported target"):
        TargetModel.load(tmp_path, layer_ids=None, num_taps=1)


def test_layer_types_are_rebuilt_when_a_config_leaves_them_out():
    spec = target_spec({"model_type": "qwen3_5_text", "num_hidden_layers": 8, "full_attention_interval": 4,
                        "hidden_size": 64, "num_attention_heads": 4})
    assert spec.layer_types == tuple(["linear_attention"] * 3 + ["full_attention"]) * 2


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3.5-moe"])
def test_layer_flops_are_twice_the_weights_a_token_meets(tmp_path, family):
    """Per-token FLOPs of each layer type against the real HF layer's weights: 2 per weight a token passes
    through (for MoE: the routed experts, the shared expert and the router), plus the conv and the delta rule."""
    from bench.flops import GDN_CHUNK, TargetShape
    from trainer.model.tiny_target import write_tiny_target

    target = TargetModel.load(write_tiny_target(tmp_path / "t", family=family), layer_ids=[1], num_taps=1)
    shape = TargetShape.from_config(target.config)
    text = target.config

    def mlp_weights(layer) -> int:
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            return sum(p.numel() for p in mlp.parameters())
        per_expert = sum(p.numel() for p in mlp.experts.parameters()) // text.num_experts
        shared = sum(p.numel() for p in mlp.shared_expert.parameters())
        return (text.num_experts_per_tok * per_expert + shared + mlp.shared_expert_gate.weight.numel()
                + mlp.gate.weight.numel())

    linear_layer, full_layer = target.decoder.layers[0], target.decoder.layers[3]
    gdn = linear_layer.linear_attn
    projections = sum(m.weight.numel() for m in (gdn.in_proj_qkv, gdn.in_proj_z, gdn.in_proj_b, gdn.in_proj_a,
                                                 gdn.out_proj))
    dk, dv, heads = gdn.head_k_dim, gdn.head_v_dim, gdn.num_v_heads
    delta_rule = heads * (6 * dk * dv + (GDN_CHUNK + 1) * (dk + dv))
    expected_linear = 2 * (projections + gdn.conv1d.weight.numel() + mlp_weights(linear_layer)) + delta_rule
    attn = full_layer.self_attn
    expected_full = 2 * (sum(m.weight.numel() for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
                         + mlp_weights(full_layer))
    assert shape.token_flops("linear_attention") == expected_linear
    assert shape.token_flops("full_attention") == expected_full
    # four layers over 10 tokens: three linear, one full with its 55 causal pairs
    pair = 4 * text.num_attention_heads * text.head_dim
    assert shape.feature_flops(num_layers=4, lengths=[10]) == 10 * (3 * expected_linear + expected_full) + 55 * pair




TORCH_PATH_FEATURES = """
import sys
sys.modules["fla"] = sys.modules["causal_conv1d"] = None  # transformers' torch path, as without the fla extra
import torch
from trainer.model.target import TargetModel
path, ids, mask, out = sys.argv[1:]
target = TargetModel.load(path, layer_ids=[1, 3, 5], num_taps=3, device="cuda", dtype=torch.float32)
assert target.kernels()["linear_attention"] == "torch"
torch.save(target.features(torch.load(ids).cuda(), torch.load(mask).cuda()).cpu(), out)
"""


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3.5-moe"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_features_with_the_fla_kernels_equal_the_torch_path(tmp_path, family):
    """On a GPU with flash-linear-attention installed the linear layers run its kernels; the tapped features
    agree with the same weights run through transformers' torch path (a second process that cannot import fla),
    in fp32."""
    import importlib.util
    import subprocess
    import sys

    from tests.trainer.conftest import REPO_ROOT, trainer_env
    from trainer.model.tiny_target import write_tiny_target

    if importlib.util.find_spec("fla") is None:
        pytest.skip("flash-linear-attention is not installed")
    path = write_tiny_target(tmp_path / "t", family=family)
    on_gpu = TargetModel.load(path, layer_ids=[1, 3, 5], num_taps=3, device="cuda", dtype=torch.float32)
    assert on_gpu.kernels()[LINEAR] == "fla"
    ids = torch.randint(0, on_gpu.config.vocab_size, (2, 200), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(mask, tmp_path / "mask.pt")
    reference = subprocess.run([sys.executable, "-c", TORCH_PATH_FEATURES, str(path), str(tmp_path / "ids.pt"),
                                str(tmp_path / "mask.pt"), str(tmp_path / "want.pt")], capture_output=True,
                               text=True, timeout=300, env=trainer_env(gpu=True), cwd=REPO_ROOT)
    assert reference.returncode == 0, reference.stderr[-3000:]
    got = on_gpu.features(ids.cuda(), mask.cuda()).cpu()
    want = torch.load(tmp_path / "want.pt")
    real = mask.bool()
    # fla's Triton dot products take fp32 inputs as TF32 (10-bit mantissa), which a random tiny model amplifies
    # layer after layer (and an MoE router turns into a different expert for a near-tied token): compare each
    # sequence as a whole, where a wrong kernel or a state crossing sequences is off by O(1)
    for row in range(ids.shape[0]):
        g, w = got[row][real[row]], want[row][real[row]]
        diff = float((g - w).norm() / w.norm())
        assert diff < 5e-2, (row, diff)


def test_with_fla_installed_a_cpu_run_of_a_hybrid_target_is_refused_in_one_line(tmp_path):
    """flash-linear-attention's kernels are Triton and refuse CPU tensors, and transformers binds them for every
    device once fla is importable. A stand-in fla package that fails exactly that way: the trainer refuses
    before loading (exit 2, one line), where it would otherwise crash mid-forward."""
    import os
    import subprocess
    import sys

    from tests.trainer.conftest import REPO_ROOT, trainer_env, write_prompts
    from trainer.model.tiny_target import write_tiny_target

    kernels = tmp_path / "site" / "fla" / "ops" / "gated_delta_rule"
    kernels.mkdir(parents=True)
    for package in (kernels.parent.parent, kernels.parent):
        (package / "__init__.py").write_text("")
    (kernels / "__init__.py").write_text(
        "def _triton(*args, **kwargs):\n"
        "    raise ValueError('Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)')\n"
        "chunk_gated_delta_rule = fused_recurrent_gated_delta_rule = _triton\n")
    target = write_tiny_target(tmp_path / "t", family="qwen3.5")
    env = trainer_env()
    env["PYTHONPATH"] = str(tmp_path / "site") + os.pathsep + env["PYTHONPATH"]
    result = subprocess.run([sys.executable, "-m", "trainer", "eval", "--target", str(target), "--drafter",
                             str(tmp_path / "none"), "--prompts", str(write_prompts(tmp_path / "p.jsonl", 2, seed=0)),
                             "--device", "cpu"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "flash-linear-attention installed" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
