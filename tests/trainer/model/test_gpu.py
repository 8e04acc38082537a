"""GPU-only checks: flex_attention's backward against the dense path, and a step at a real model's shape."""
from __future__ import annotations

import time

import pytest
import torch

from tests.trainer.tiny_models import make_drafter, random_ids, tiny_target_dir  # noqa: F401

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_target(tiny_target_dir):
    from trainer.model.target import TargetModel

    return TargetModel.load(tiny_target_dir, layer_ids=None, num_taps=3, device="cuda", dtype=torch.float32)


@pytest.mark.parametrize("sliding_window", [None, 6])
def test_flex_and_dense_gradients_agree(cuda_target, sliding_window):
    from trainer.training.objective import dflash_step

    input_ids = random_ids(cuda_target, (2, 64), seed=8)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[1, 50:] = 0
    features = cuda_target.features(input_ids)
    grads = {}
    for backend in ("flex", "sdpa"):
        drafter = make_drafter(cuda_target, block_size=8, sliding_window=sliding_window, seed=3)
        drafter.attention_backend = backend
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=6, block_size=8, gamma=4.0,
                          noise=0.0, generator=torch.Generator().manual_seed(0))
        out.loss.backward()
        grads[backend] = (out.loss.detach(), [p.grad.clone() for p in drafter.parameters()])
    torch.testing.assert_close(grads["flex"][0], grads["sdpa"][0], rtol=1e-4, atol=1e-4)
    for flex_grad, dense_grad in zip(grads["flex"][1], grads["sdpa"][1]):
        torch.testing.assert_close(flex_grad, dense_grad, rtol=2e-3, atol=2e-4)


@pytest.mark.slow
def test_step_at_qwen3_8b_shape(capsys):
    """5 drafter layers on Qwen3-8B's sizes, 3072 tokens, 512 anchors, B=16: runs, finite, and how fast."""
    from transformers import Qwen3Config

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.training.objective import dflash_step

    target_config = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                vocab_size=151936, max_position_embeddings=40960,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    embed = torch.nn.Embedding(151936, 4096, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    lm_head = torch.nn.Linear(4096, 151936, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    torch.nn.init.normal_(lm_head.weight, std=0.02)
    config = DrafterConfig.from_target(target_config, num_layers=5, block_size=16,
                                       target_layer_ids=[1, 9, 17, 25, 33], mask_token_id=151669)
    drafter = DFlashDrafter(config, embed_tokens=embed, lm_head=lm_head).cuda().train()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=6e-4, weight_decay=0.0, fused=True)
    seq = 3072
    input_ids = torch.randint(0, 151000, (1, seq), device="cuda")
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :200] = 0
    features = torch.randn(1, seq, 5 * 4096, device="cuda", dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=512, block_size=16,
                              gamma=7.0, noise=0.0, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        return out

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, steps = time.perf_counter(), 10
    losses = [step().loss.item() for _ in range(steps)]
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n8B-shape drafter step: {elapsed / steps * 1000:.1f} ms/step, "
              f"{seq * steps / elapsed / 1000:.1f} Ktok/s (drafter only), "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, losses {losses[0]:.3f}->{losses[-1]:.3f}")
    assert all(torch.isfinite(torch.tensor(losses)))


def test_compiled_drafter_matches_eager(cuda_target):
    from trainer.training.objective import dflash_step

    input_ids = random_ids(cuda_target, (2, 48), seed=10)
    loss_mask = torch.ones_like(input_ids)
    features = cuda_target.features(input_ids)
    drafter = make_drafter(cuda_target, block_size=8, seed=4)
    losses = []
    for model in (drafter, torch.compile(drafter)):
        losses.append(dflash_step(model, features, input_ids, loss_mask, num_anchors=5, block_size=8, gamma=4.0,
                                  noise=0.0, generator=torch.Generator().manual_seed(0)).loss)
    losses[1].backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-4)
    assert all(torch.isfinite(p.grad).all() for p in drafter.parameters())


@pytest.mark.parametrize("per_shape", [False, True])
def test_compiled_block_convolution_matches_eager(cuda_target, per_shape):
    """DFlash2's BlockConv compiled (kernels.compile_block_convs, as the trainer runs it on a GPU: one static graph
    per bucket shape, or the dynamic graph of before) gives the eager code's loss and gradients, every
    parameter's."""
    from trainer.model.kernels import compile_block_convs
    from trainer.training.objective import dflash_step

    input_ids = random_ids(cuda_target, (2, 64), seed=11)
    loss_mask = torch.ones_like(input_ids)
    features = cuda_target.features(input_ids)
    shapes = [(2, 6 * 8)] if per_shape else None   # 2 sequences, 6 anchors of 8 slots
    results = {}
    for compiled in (False, True):
        drafter = make_drafter(cuda_target, block_size=8, seed=7, architecture="dflash2")
        with torch.no_grad():   # away from the identity start, so the convolutions' arithmetic shows
            for name, param in drafter.named_parameters():
                if "conv" in name:
                    param.add_(0.05 * torch.randn_like(param))
        line = compile_block_convs(drafter, torch.device("cuda"), on=compiled, shapes=shapes)
        assert (line is not None) == compiled and (not compiled or ("per bucket shape" in line) == per_shape)
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=6, block_size=8, gamma=4.0,
                          noise=0.0, generator=torch.Generator().manual_seed(0))
        out.loss.backward()
        results[compiled] = (out.loss.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters()
                                                 if p.grad is not None})
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    assert sorted(results[True][1]) == sorted(results[False][1])
    assert any("base_kernel" in name for name in results[True][1])
    for name, grad in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_bucket_shapes_compiled_at_start_up_leave_nothing_to_compile(cuda_target):
    """compile_block_conv_shapes warms every declared shape under the training autocast: steps of those shapes,
    and of a shape no bucket gives (eager), compile nothing more."""
    import contextlib

    from trainer.model.kernels import compile_block_convs
    from trainer.training.compile_warmup import compile_attention, compile_block_conv_shapes
    from trainer.training.metrics import compiled_graphs
    from trainer.training.objective import dflash_step

    drafter = make_drafter(cuda_target, num_layers=2, block_size=8, seed=9, architecture="dflash2")
    batches = [(2, 300, 20), (3, 410, 33), (5, 257, 40)]   # (sequences, length, anchors)
    shapes = [(batch, anchors * 8) for batch, _, anchors in batches]
    compile_block_convs(drafter, torch.device("cuda"), shapes=shapes)
    lines: list[str] = []
    compile_attention(drafter, feature_dtype=torch.float32, autocast=contextlib.nullcontext(), say=lines.append)
    assert compile_block_conv_shapes(drafter, shapes, feature_dtype=torch.float32, autocast=contextlib.nullcontext(),
                                     say=lines.append) == len(shapes)
    assert all(p.grad is None for p in drafter.parameters())
    before = compiled_graphs()
    generator = torch.Generator().manual_seed(0)
    for i, (batch, seq, anchors) in enumerate(batches + [(4, 333, 27)]):
        input_ids = random_ids(cuda_target, (batch, seq), seed=30 + i)
        out = dflash_step(drafter, cuda_target.features(input_ids), input_ids, torch.ones_like(input_ids),
                          num_anchors=anchors, block_size=8, gamma=4.0, noise=0.0, generator=generator)
        out.loss.backward()
    torch.cuda.synchronize()
    assert compiled_graphs() == before, lines


def test_new_batch_shapes_do_not_recompile_every_step(cuda_target, capsys):
    """Buckets and anchor counts change the shapes from batch to batch; the block mask compiles nothing and
    flex_attention compiles once for all shapes (twice: batches of one sequence are a shape of their own)."""
    from trainer.training.objective import dflash_step

    drafter = make_drafter(cuda_target, block_size=8, seed=5)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    times = []
    for i, (batch, seq) in enumerate([(2, 64), (1, 96), (3, 80), (2, 128), (1, 200), (4, 72), (2, 150),
                                      (3, 110), (1, 250), (2, 90), (4, 130), (1, 300)]):
        input_ids = random_ids(cuda_target, (batch, seq), seed=i)
        loss_mask = torch.ones_like(input_ids)
        features = cuda_target.features(input_ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = dflash_step(drafter, features, input_ids, loss_mask, num_anchors=5 + 3 * i, block_size=8,
                          gamma=4.0, noise=0.0, generator=generator)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with capsys.disabled():
        print("\nstep seconds with a new shape each step:", " ".join(f"{t:.2f}" for t in times))
    assert max(times[-4:]) < 1.0


@pytest.mark.parametrize(("sliding_window", "architecture"), [(None, "dflash"), (12, "dflash"), (None, "dflash2")])
def test_start_up_compile_leaves_nothing_to_compile_for_real_batches(cuda_target, sliding_window, architecture):
    """After compile_attention, batches of new shapes (more than one sequence) compile nothing more; DFlash2's
    compiled block convolutions included."""
    import contextlib

    from trainer.model.kernels import compile_block_convs
    from trainer.training.compile_warmup import compile_attention
    from trainer.training.metrics import compiled_graphs
    from trainer.training.objective import dflash_step

    drafter = make_drafter(cuda_target, num_layers=3, block_size=8, sliding_window=sliding_window, seed=6,
                           architecture=architecture)
    compile_block_convs(drafter, torch.device("cuda"))
    lines: list[str] = []
    kinds = compile_attention(drafter, feature_dtype=torch.float32, autocast=contextlib.nullcontext(),
                              say=lines.append)
    assert kinds == (2 if sliding_window else 1) and len(lines) == 2 * kinds
    print("\n".join(lines))
    assert all(p.grad is None for p in drafter.parameters())
    before = compiled_graphs()
    generator = torch.Generator().manual_seed(0)
    # every size above one 128-wide tile: a single tile is a size of 1, which the compiler specialises
    for i, (batch, seq, anchors) in enumerate([(2, 300, 20), (3, 410, 33), (5, 257, 40), (2, 600, 64)]):
        input_ids = random_ids(cuda_target, (batch, seq), seed=20 + i)
        out = dflash_step(drafter, cuda_target.features(input_ids), input_ids, torch.ones_like(input_ids),
                          num_anchors=anchors, block_size=8, gamma=4.0, noise=0.0, generator=generator)
        out.loss.backward()
    torch.cuda.synchronize()
    assert compiled_graphs() == before, lines
