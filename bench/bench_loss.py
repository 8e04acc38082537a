"""The drafter's chunked LM-head loss against its floor: the two matrix products it cannot avoid (the logits,
and the gradient of the hidden states), and against the loss's previous version (fp32 logits, logsumexp, the
softmax scaled in place), all timed in the same process on the same data.

    python bench/bench_loss.py                     # GPU: 3072 blocks x 15 slots, Qwen3-8B's hidden size and vocab
    python bench/bench_loss.py --rows 2048 --hidden 64 --vocab 1000 --device cpu     # CPU smoke
"""
from __future__ import annotations

import argparse
import json

import torch
from devicetime import timings

from trainer.training.objective import LOGITS_PER_CHUNK, chunked_weighted_ce


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3072 * 15, help="block slots through the LM head")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=5)
    return parser.parse_args(argv)


def previous_loss_and_grad(hidden, weight, labels, weights, chunk_rows: int) -> torch.Tensor:
    """The loss before it kept the logits in the head's dtype (for comparison only): (loss, grad of hidden)."""
    weights = weights / weights.sum()
    total = torch.zeros((), device=hidden.device)
    grad = torch.empty_like(hidden)
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        logits = (hidden[rows].to(weight.dtype) @ weight.t()).float()
        lse = torch.logsumexp(logits, dim=-1)
        label, weight_rows = labels[rows], weights[rows]
        total += ((lse - logits.gather(1, label[:, None]).squeeze(1)) * weight_rows).sum()
        logits.argmax(dim=-1)
        probs = logits.sub_(lse[:, None]).exp_().mul_(weight_rows[:, None])
        probs.scatter_add_(1, label[:, None], -weight_rows[:, None])
        grad[rows] = (probs.to(weight.dtype) @ weight).to(hidden.dtype)
    return total, grad


def library_losses(hidden, weight, labels, weights) -> dict:
    """The libraries' fused linear cross-entropies on the same data, where they import (GPU, Triton): each as a
    function computing the same weighted loss and its gradient. liger-kernel's with reduction="none" (the only
    way to weight each row) and its argmax (the trainer's accuracy needs it); cut-cross-entropy's has no argmax."""
    found = {}
    normalised = weights / weights.sum()
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        def liger():
            per_row, _, _, predicted = LigerFusedLinearCrossEntropyFunction.apply(
                hidden, weight, labels, None, None, -100, 0.0, 0.0, "none", None, False, None, False, False, True)
            return (per_row * normalised).sum(), predicted
        found["liger"] = liger
    except ImportError:
        pass
    try:
        from cut_cross_entropy import linear_cross_entropy

        def cce():
            per_row = linear_cross_entropy(hidden, weight, labels, reduction="none")
            return (per_row * normalised).sum(), None
        found["cut_cross_entropy"] = cce
    except ImportError:
        pass
    return found


def best_seconds(fn, device: torch.device, repeat: int) -> float:
    return min(timings(fn, device, repeat))


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    head_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    # the drafter's final norm returns its input's dtype: bf16 under the GPU's autocast
    hidden = torch.randn(args.rows, args.hidden, device=device, generator=generator).to(head_dtype)
    hidden.requires_grad_(True)
    weight = (torch.randn(args.vocab, args.hidden, device=device, generator=generator) * 0.02).to(head_dtype)
    labels = torch.randint(0, args.vocab, (args.rows,), device=device, generator=generator)
    weights = torch.rand(args.rows, device=device, generator=generator)
    chunk_rows = max(1, LOGITS_PER_CHUNK // args.vocab)

    def loss_and_grad():
        loss = chunked_weighted_ce(hidden, weight, labels, weights).loss
        loss.backward()
        hidden.grad = None

    def floor():  # the same two products, chunk by chunk, with nothing between them
        for start in range(0, args.rows, chunk_rows):
            logits = hidden[start:start + chunk_rows].detach().to(head_dtype) @ weight.t()
            logits @ weight

    with torch.no_grad():
        previous = previous_loss_and_grad(hidden, weight, labels, weights, chunk_rows)
    loss = chunked_weighted_ce(hidden, weight, labels, weights).loss
    (grad,) = torch.autograd.grad(loss, hidden)
    agreement = float((grad - previous[1]).norm() / previous[1].norm())
    loss_s = best_seconds(loss_and_grad, device, args.repeat)
    floor_s = best_seconds(floor, device, args.repeat)
    with torch.no_grad():
        previous_s = best_seconds(lambda: previous_loss_and_grad(hidden, weight, labels, weights, chunk_rows),
                                  device, args.repeat)
    libraries = {}
    for name, fn in (library_losses(hidden, weight, labels, weights) if device.type == "cuda" else {}).items():
        try:
            lib_loss, _ = fn()
            (lib_grad,) = torch.autograd.grad(lib_loss, hidden)

            def lib_step(fn=fn):
                value, _ = fn()
                value.backward()
                hidden.grad = None
            libraries[name] = {"ms": 1000 * best_seconds(lib_step, device, args.repeat),
                               "loss_difference": abs(float(lib_loss.detach()) - float(loss.detach())),
                               "grad_relative_difference": float((lib_grad - grad).norm() / grad.norm())}
        except Exception as exc:  # a library that fails here is reported, not fatal: the figure is what we want
            libraries[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    flops = 2 * 2 * args.rows * args.hidden * args.vocab
    result = {"device": str(device), "rows": args.rows, "hidden": args.hidden, "vocab": args.vocab,
              "chunk_rows": chunk_rows, "loss_ms": 1000 * loss_s, "floor_ms": 1000 * floor_s,
              "previous_ms": 1000 * previous_s, "loss_over_floor": loss_s / floor_s,
              "previous_over_floor": previous_s / floor_s, "speedup_over_previous": previous_s / loss_s,
              "floor_tflops": flops / floor_s / 1e12, "loss_tflops": flops / loss_s / 1e12,
              "loss_difference": abs(float(loss.detach()) - float(previous[0])), "grad_relative_difference": agreement,
              "libraries": libraries}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
