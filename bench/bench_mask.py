"""The drafter's block mask at the seed's batch shapes: the closed-form BlockMask (trainer/model/masks.py) against the
mask_mod evaluated by a compiled create_block_mask, in build time, and flex_attention's output and gradients
through both (they must agree).

    python bench/bench_mask.py            # one GPU; --json for one object
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trainer.config import SEED_BUCKETS
from trainer.model.masks import FULL_ATTENTION, SLIDING_ATTENTION, block_mask_mod, build_drafter_mask


def batch_shapes(token_budget: int, anchor_budget: int, num_anchors: int, block_size: int):
    """(batch, context_len, blocks) of each seed bucket's longest batch, as the trainer lays them out."""
    for hi in SEED_BUCKETS[1:]:
        seq = hi - 1
        batch = max(1, token_budget // seq)
        yield batch, seq, max(1, min(num_anchors, anchor_budget // batch, seq - 1))


def random_anchors(batch: int, context_len: int, blocks: int, device) -> torch.Tensor:
    return torch.stack([torch.randperm(context_len - 1, device=device)[:blocks].sort().values
                        for _ in range(batch)])


def gpu_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def compiled_mask_ms(create, anchors, context_len, block_size, window) -> tuple[float, float]:
    """(first call incl. compile, median warm call) of the compiled create_block_mask for one shape."""
    batch, blocks = anchors.shape
    q_len = blocks * block_size
    mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
    began = time.perf_counter()
    create(mask_mod, batch, None, q_len, context_len + q_len, device=anchors.device)
    torch.cuda.synchronize()
    first = (time.perf_counter() - began) * 1000
    warm = gpu_ms(lambda: create(mask_mod, batch, None, q_len, context_len + q_len, device=anchors.device), 10)
    return first, warm


def attention_agrees(anchors, context_len, block_size, window, create, attention) -> float:
    """Largest relative difference of flex_attention's output and input gradients, closed form vs mask_mod."""
    batch, blocks = anchors.shape
    q_len, kv_len = blocks * block_size, context_len + blocks * block_size
    heads, kv_heads, dim = 32, 8, 128
    q = torch.randn(batch, heads, q_len, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, kv_len, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    layer_type = SLIDING_ATTENTION if window else FULL_ATTENTION
    closed = build_drafter_mask(anchors, context_len=context_len, block_size=block_size, layer_types=[layer_type],
                                sliding_window=window, backend="flex").masks[layer_type]
    mask_mod = block_mask_mod(anchors, context_len=context_len, block_size=block_size, window=window)
    reference = create(mask_mod, batch, None, q_len, kv_len, device="cuda")
    results = []
    for mask in (closed, reference):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(*inputs, block_mask=mask, enable_gqa=True)
        out.float().square().sum().backward()
        results.append([out.detach(), *(t.grad for t in inputs)])
    return max(((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-6)).item()
               for a, b in zip(*results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-budget", type=int, default=49152)
    parser.add_argument("--anchor-budget", type=int, default=3072)
    parser.add_argument("--num-anchors", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--window", type=int, default=2048, help="sliding window of the second row per shape")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    create = torch.compile(create_block_mask)
    attention = torch.compile(flex_attention, dynamic=True)
    torch.manual_seed(0)
    rows = []
    for batch, context_len, blocks in batch_shapes(args.token_budget, args.anchor_budget, args.num_anchors,
                                                   args.block_size):
        anchors = random_anchors(batch, context_len, blocks, "cuda")
        for window in (None, args.window):
            types = [SLIDING_ATTENTION if window else FULL_ATTENTION]
            closed_ms = gpu_ms(lambda: build_drafter_mask(
                anchors, context_len=context_len, block_size=args.block_size, layer_types=types,
                sliding_window=window, backend="flex"), 20)
            first_ms, warm_ms = compiled_mask_ms(create, anchors, context_len, args.block_size, window)
            rel = attention_agrees(anchors, context_len, args.block_size, window, create, attention)
            rows.append(dict(batch=batch, context_len=context_len, blocks=blocks, window=window,
                             closed_form_ms=round(closed_ms, 3), compiled_first_ms=round(first_ms, 1),
                             compiled_warm_ms=round(warm_ms, 3), max_rel_diff=rel))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if args.json:
        print(json.dumps(report))
        return
    print(f"{'batch x S':>10} {'blocks':>6} {'window':>6} {'closed ms':>9} {'compiled 1st ms':>15} "
          f"{'compiled ms':>11} {'flex rel diff':>13}")
    for r in rows:
        print(f"{r['batch']:>4}x{r['context_len']:<5} {r['blocks']:>6} {str(r['window']):>6} "
              f"{r['closed_form_ms']:>9.3f} {r['compiled_first_ms']:>15.1f} {r['compiled_warm_ms']:>11.3f} "
              f"{r['max_rel_diff']:>13.2e}")


if __name__ == "__main__":
    main()
