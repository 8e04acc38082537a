"""The packed target's attention alone, each kernel that takes a packed row of sequences (its sequences' bounds):
torch's varlen flash attention (what trainer/model/packing.py runs: q, k and v as the views of one merged product
that a compiled layer hands over, key/value heads not repeated) against the same kernel on contiguous copies with
the key/value heads repeated (the trainer's call before, and still where a torch's varlen_attn refuses views or
grouped heads), and cuDNN's ragged attention, on the 8B shape (32 query heads, 8 key/value heads, head size 128),
causal, forward only (the target is frozen).

    python bench/bench_target_attention.py [--tokens 36864] [--repeat 20]

Prints one line per kernel (ms per call, TFLOP/s of causal pairs) and each kernel's largest difference from the
first's output. A kernel that does not run here says why in its line. `lean_inputs` in the JSON: whether this
torch's varlen_attn took the views (false: the trainer copies, and the first two rows time the same work).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.model import packing  # noqa: E402


def sequence_lengths(tokens: int, seed: int) -> list[int]:
    """Random sequence lengths of 300 to 3,300 tokens (most of an 8B batch's buckets) until `tokens`."""
    generator, lengths = torch.Generator().manual_seed(seed), []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(300, 3300, (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - tokens
    return [n for n in lengths if n > 0]


def flash_varlen(q, k, v, bounds, longest, scale):
    """The trainer's own call (packing._varlen_attention): [1, heads, T, D] in, [1, T, heads, D] out."""
    return packing._varlen_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), bounds, longest, scale=scale,
                                     window=None)[0]


def flash_varlen_copied(q, k, v, bounds, longest, scale):
    """The same kernel on contiguous inputs with every query head's key/value head repeated for it."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    return packing._varlen_call(q.contiguous(), k, v, bounds, longest, scale=scale, window=None)[0]


def cudnn_ragged(q, k, v, bounds, longest, scale):
    q, k, v = (t.contiguous() for t in (q, k, v))
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, bounds, bounds, longest, longest, False, 0.0,
                                                   True, False, scale=scale)[0]


def cudnn_ragged_expanded(q, k, v, bounds, longest, scale):
    """cuDNN with key/value heads repeated to the query's count (where its kernel takes no grouped heads)."""
    groups = q.shape[1] // k.shape[1]
    return cudnn_ragged(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), bounds, longest, scale)


KERNELS = {"flash varlen (now)": flash_varlen, "flash varlen, copied, heads repeated (before)": flash_varlen_copied,
           "cudnn ragged": cudnn_ragged,
           "cudnn ragged, kv heads repeated": cudnn_ragged_expanded}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=36864, help="packed tokens per call (an 8B batch's real tokens)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_target_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    lengths = sequence_lengths(args.tokens, args.seed)
    bounds = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    longest, heads, kv_heads, size = max(lengths), 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    merged = torch.randn(args.tokens, heads + 2 * kv_heads, size, device="cuda", generator=g, dtype=torch.bfloat16)
    q, k, v = merged.split([heads, kv_heads, kv_heads], dim=1)   # [T, heads, D] views, as a compiled layer has them
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    flops = 4 * pairs * heads * size
    rows, reference = [], None
    for name, kernel in KERNELS.items():
        try:
            out = kernel(q, k, v, bounds, longest, size ** -0.5)
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(args.repeat):
                kernel(q, k, v, bounds, longest, size ** -0.5)
            torch.cuda.synchronize()
        except (RuntimeError, TypeError, ImportError) as exc:
            rows.append({"kernel": name, "error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]})
            print(f"{name:46s} does not run: {rows[-1]['error']}", file=sys.stderr)
            continue
        ms = 1000 * (time.perf_counter() - began) / args.repeat
        reference = out if reference is None else reference
        difference = float((out.float() - reference.float()).abs().max())
        rows.append({"kernel": name, "ms": ms, "tflops": flops / ms / 1e9, "max_abs_difference": difference})
        print(f"{name:46s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s  max |diff| {difference:.2e}",
              file=sys.stderr)
    print(json.dumps({"device_name": torch.cuda.get_device_name(), "tokens": args.tokens,
                      "sequences": len(lengths), "longest": longest, "lean_inputs": packing._lean_inputs,
                      "kernels": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
