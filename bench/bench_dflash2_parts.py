"""What DFlash2 adds to a step, part by part, at a real shape: the selector's top-K over one loss chunk's logits
and one block convolution forward and backward (eager against torch.compile, dynamic shapes or not). Each figure is
the median of `--repeat` timings after a warm-up. Random logits: a real step's top-K took 3.5 times as long on the
same card (bench/RESULTS.md), so the top-K row is a floor.

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

from trainer.model.modeling_dflash import block_conv  # noqa: E402


def timed_ms(fn, device: torch.device, repeat: int) -> float:
    """The median wall time of fn() in ms."""
    return statistics.median(timings(fn, device, repeat)) * 1000


def topk_rows(args, device: torch.device) -> list[dict]:
    logits = torch.randn(args.rows, args.vocab, device=device, dtype=torch.bfloat16)
    return [{"part": f"top {args.k} of [{args.rows}, {args.vocab}]", "how": "topk",
             "ms": timed_ms(lambda: logits.topk(args.k, dim=-1), device, args.repeat)}]


def conv_rows(args, device: torch.device) -> list[dict]:
    tokens, hidden, taps, groups = args.blocks * args.block_size, args.hidden, 2, args.hidden // 16
    y = torch.randn(1, tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    kernels = torch.randn(1, args.blocks, args.block_size, 2, taps, groups, device=device, dtype=torch.bfloat16,
                          requires_grad=True)
    base = torch.randn(2, taps, hidden, device=device, requires_grad=True)
    grad = torch.randn(1, tokens, hidden, device=device, dtype=torch.bfloat16)
    ways = {"eager": block_conv}
    if device.type == "cuda":
        ways["compiled, dynamic"] = torch.compile(block_conv, dynamic=True)
        ways["compiled, static"] = torch.compile(block_conv, dynamic=False)
    rows = []
    for how, conv in ways.items():
        def forward_backward():
            out = conv(y, kernels, base, side=1, block_size=args.block_size)
            torch.autograd.backward(out, grad)
        rows.append({"part": "block conv fwd+bwd", "how": how,
                     "ms": timed_ms(forward_backward, device, args.repeat)})
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
