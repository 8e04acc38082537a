"""What DFlash2 adds to a step, part by part, at a real shape: the selector's top-K over one loss chunk's logits
(torch.topk, and blockwise as the trainer takes it now) and one block convolution forward and backward (eager,
compiled with dynamic shapes as the trainer did, compiled per bucket shape as it does now). Each figure is the
median of `--repeat` timings after a warm-up. Random logits: a real step's top-K took 3.5 times as long on the
same card (bench/RESULTS.md), so the top-K rows are a floor.

    python3 bench/bench_dflash2_parts.py                    # the 8B shapes on a GPU
    python3 bench/bench_dflash2_parts.py --tiny --device cpu  # a smoke run (figures mean nothing)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from devicetime import timings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.model.kernels import compile_block_convs  # noqa: E402
from trainer.model.modeling_dflash import BlockConv  # noqa: E402
from trainer.training.selector_objective import blockwise_topk  # noqa: E402


def timed_ms(fn, device: torch.device, repeat: int) -> float:
    """The median wall time of fn() in ms."""
    return statistics.median(timings(fn, device, repeat)) * 1000


def topk_rows(args, device: torch.device) -> list[dict]:
    logits = torch.randn(args.rows, args.vocab, device=device, dtype=torch.bfloat16)
    part = f"top {args.k} of [{args.rows}, {args.vocab}]"
    return [{"part": part, "how": "torch.topk (before)",
             "ms": timed_ms(lambda: logits.topk(args.k, dim=-1), device, args.repeat)},
            {"part": part, "how": "blockwise (now)",
             "ms": timed_ms(lambda: blockwise_topk(logits, args.k), device, args.repeat)}]


def conv_rows(args, device: torch.device) -> list[dict]:
    """One BlockConv side forward and backward, as the trainer binds it (kernels.compile_block_convs): eager, one
    graph with dynamic shapes (the trainer's way before), one static graph per bucket shape (its way now)."""
    tokens, hidden = args.blocks * args.block_size, args.hidden
    conv = BlockConv(hidden, kernel_size=2, group_size=16, block_size=args.block_size).to(device)
    y = torch.randn(1, tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    kernels = torch.randn(1, args.blocks, args.block_size, 2, 2, conv.groups, device=device, dtype=torch.bfloat16,
                          requires_grad=True)
    grad = torch.randn(1, tokens, hidden, device=device, dtype=torch.bfloat16)
    ways = {"eager": dict(on=False)}
    if device.type == "cuda":
        ways["compiled, dynamic shapes (before)"] = dict(on=True, shapes=None)
        ways["compiled per bucket shape (now)"] = dict(on=True, shapes=[(1, tokens)])
    rows = []
    for how, binding in ways.items():
        compile_block_convs(conv, device, **binding)

        def forward_backward():
            torch.autograd.backward(conv(y, kernels, 1), grad)
        rows.append({"part": "block conv fwd+bwd", "how": how,
                     "ms": timed_ms(forward_backward, device, args.repeat)})
        compile_block_convs(conv, device, on=False)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small shapes, for a smoke run")
    parser.add_argument("--rows", type=int, default=441, help="rows of one loss chunk (8B: 63 blocks x 7 slots)")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=3072)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.vocab, args.blocks, args.hidden, args.repeat = 8, 4000, 16, 64, 2
    device = torch.device(args.device)
    rows = topk_rows(args, device) + conv_rows(args, device)
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
